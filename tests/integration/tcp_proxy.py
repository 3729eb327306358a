#!/usr/bin/python3
"""A pausable TCP proxy for tests: cut one daemon off from etcd.

    tcp_proxy.py LISTEN_PORT TARGET_PORT      (127.0.0.1 both; LISTEN_PORT 0: any)

Prints "listening PORT" once it accepts connections, then reads commands
from stdin, one per line, and answers each with one line:
  pause   -> "paused":  no byte moves in either direction on any connection,
             and new connections are left unaccepted (they complete in the
             kernel's backlog and then hear nothing): to both sides the
             peer looks frozen, as in a partition, and nothing is reset.
  resume  -> "resumed": everything held back flows again.
  drop    -> "dropped": every connection is reset (RST).
  count   -> "N": connections open now.
End of stdin (the test ended or died) stops the proxy.
"""

import os
import selectors
import socket
import struct
import sys

CHUNK = 65536


class Pipe:
    """One accepted connection and its connection to the target."""

    def __init__(self, client, upstream):
        self.socks = (client, upstream)
        self.pending = {client: b'', upstream: b''}  # bytes waiting to be sent TO that socket
        self.closing = False


class Proxy:
    def __init__(self, listen_port, target_port):
        self.target = ('127.0.0.1', target_port)
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(('127.0.0.1', listen_port))
        self.lsock.listen(64)
        self.lsock.setblocking(False)
        self.sel = selectors.DefaultSelector()
        self.pipes = {}   # socket -> Pipe
        self.paused = False
        self.commands = b''
        self.sel.register(0, selectors.EVENT_READ, 'control')
        self.sel.register(self.lsock, selectors.EVENT_READ, 'accept')

    def other(self, pipe, s):
        return pipe.socks[1] if s is pipe.socks[0] else pipe.socks[0]

    def interest(self, s):
        """Register S for what it can do now (nothing while paused)."""
        pipe = self.pipes.get(s)
        if pipe is None:
            return
        mask = 0
        if not self.paused:
            # Read only while the other side's backlog is small.
            if not pipe.closing and len(pipe.pending[self.other(pipe, s)]) < 4 * CHUNK:
                mask |= selectors.EVENT_READ
            if pipe.pending[s]:
                mask |= selectors.EVENT_WRITE
        registered = self.sel.get_map().get(s) is not None
        if mask and registered:
            self.sel.modify(s, mask, 'data')
        elif mask:
            self.sel.register(s, mask, 'data')
        elif registered:
            self.sel.unregister(s)

    def close(self, pipe, reset=False):
        for s in pipe.socks:
            self.pipes.pop(s, None)
            if self.sel.get_map().get(s):
                self.sel.unregister(s)
            if reset:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
            s.close()

    def accept(self):
        try:
            client, _ = self.lsock.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=2)
        except OSError:
            # The target refuses: so do we (a reset, as etcd down would).
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack('ii', 1, 0))
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pipe = Pipe(client, upstream)
        for s in pipe.socks:
            self.pipes[s] = pipe
            self.interest(s)

    def data(self, s, mask):
        pipe = self.pipes.get(s)
        if pipe is None:
            return
        peer = self.other(pipe, s)
        if mask & selectors.EVENT_READ:
            try:
                chunk = s.recv(CHUNK)
            except (BlockingIOError, InterruptedError):
                chunk = None
            except OSError:
                self.close(pipe, reset=True)
                return
            if chunk == b'':
                # One side closed: pass the close on once all is sent.
                pipe.closing = True
                if not pipe.pending[peer]:
                    self.close(pipe)
                    return
            elif chunk:
                pipe.pending[peer] += chunk
        if mask & selectors.EVENT_WRITE and pipe.pending[s]:
            try:
                n = s.send(pipe.pending[s])
                pipe.pending[s] = pipe.pending[s][n:]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                self.close(pipe, reset=True)
                return
            if pipe.closing and not pipe.pending[s] and not pipe.pending[peer]:
                self.close(pipe)
                return
        for x in pipe.socks:
            self.interest(x)

    def control(self):
        """Run the commands that arrived on stdin.  False at its end."""
        data = os.read(0, 4096)
        if not data:
            return False
        self.commands += data
        while b'\n' in self.commands:
            line, self.commands = self.commands.split(b'\n', 1)
            reply = self.command(line.decode().strip())
            sys.stdout.write(reply + '\n')
            sys.stdout.flush()
        return True

    def command(self, cmd):
        if cmd == 'pause':
            self.paused = True
            if self.sel.get_map().get(self.lsock):
                self.sel.unregister(self.lsock)
            for s in list(self.pipes):
                self.interest(s)
            return 'paused'
        if cmd == 'resume':
            self.paused = False
            if not self.sel.get_map().get(self.lsock):
                self.sel.register(self.lsock, selectors.EVENT_READ, 'accept')
            for s in list(self.pipes):
                self.interest(s)
            return 'resumed'
        if cmd == 'drop':
            for pipe in {id(p): p for p in self.pipes.values()}.values():
                self.close(pipe, reset=True)
            return 'dropped'
        if cmd == 'count':
            return str(len(self.pipes) // 2)
        return f'error unknown command {cmd!r}'

    def run(self):
        sys.stdout.write(f'listening {self.lsock.getsockname()[1]}\n')
        sys.stdout.flush()
        while True:
            for key, mask in self.sel.select():
                if key.data == 'control':
                    if not self.control():
                        return
                elif key.data == 'accept':
                    self.accept()
                elif key.fileobj in self.pipes:
                    self.data(key.fileobj, mask)


def main():
    if len(sys.argv) != 3:
        sys.stderr.write('usage: tcp_proxy.py LISTEN_PORT TARGET_PORT\n')
        return 2
    Proxy(int(sys.argv[1]), int(sys.argv[2])).run()
    return 0


if __name__ == '__main__':
    sys.exit(main())
