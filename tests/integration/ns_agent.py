#!/usr/bin/python3
"""A process inside a namespace that does what the test asks (JSON lines).

Started by service_helpers.NsAgent under `unshare` (a private mount
namespace for the "host" side, or a container-like one).  It first runs the
shell SETUP given as argv[1] (e.g. bind mounts), then answers one request
per line on stdin with one JSON line on stdout:

  {"op": "run", "argv": [...], "env": {...}, "timeout": S}
        -> {"rc": N, "out": TEXT, "err": TEXT}    (rc -1: timed out, killed)
  {"op": "spawn", "argv": [...], "env": {...}, "stderr": PATH}
        -> {"pid": N}                             a background child
  {"op": "wait", "pid": N, "timeout": S}
        -> {"status": EXIT or -SIGNAL} or {"status": null} (still running)
  {"op": "mkdir" | "rmdir" | "stat" | "listdir" | "read", "path": P}
        -> {} / {"mode": .., "ino": ..} / {"names": [..]} / {"data": ..}
           or {"errno": N}
  {"op": "wait_children", "timeout": S}
        -> {"left": N}    waits until no child is left (N = 0) or S passed
  {"op": "info"} -> {"pid": getpid()}             as seen inside
  {"op": "exit"}

It is a child subreaper (PR_SET_CHILD_SUBREAPER), so a daemon that detaches
from a command it ran (mount(8) -> mount.fuse3 -> lockfs, which forks) is
re-parented to it: "wait" then gives that daemon's exit status too.  The
agent itself holds the locks it takes with "mkdir" (it is the calling
process), like a long-lived shell in a container.
"""

import ctypes
import json
import os
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36

# statuses of children reaped while waiting for something else
reaped = {}


def reap_all():
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        reaped[pid] = os.waitstatus_to_exitcode(status)


def wait_for(pid, timeout):
    deadline = time.monotonic() + timeout
    while True:
        if pid in reaped:
            return reaped.pop(pid)
        try:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                return os.waitstatus_to_exitcode(status)
        except ChildProcessError:
            reap_all()
            if pid in reaped:
                return reaped.pop(pid)
            return None if os.path.exists(f'/proc/{pid}') else 'not-a-child'
        if time.monotonic() > deadline:
            return None
        time.sleep(0.005)


def env_of(req):
    env = dict(os.environ)
    env.update(req.get('env') or {})
    return env


def serve(req):
    op = req['op']
    path = req.get('path')
    try:
        if op == 'run':
            try:
                r = subprocess.run(req['argv'], env=env_of(req), stdin=subprocess.DEVNULL,
                                   capture_output=True, timeout=req.get('timeout', 30))
                return {'rc': r.returncode, 'out': r.stdout.decode(errors='replace'),
                        'err': r.stderr.decode(errors='replace')}
            except subprocess.TimeoutExpired as e:
                return {'rc': -1, 'out': (e.stdout or b'').decode(errors='replace'),
                        'err': (e.stderr or b'').decode(errors='replace')}
        if op == 'spawn':
            # fork+exec by hand: no Popen object whose bookkeeping would
            # reap behind our back
            out = os.open(req['stderr'], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) \
                if req.get('stderr') else os.open(os.devnull, os.O_WRONLY)
            env = env_of(req)
            pid = os.fork()
            if pid == 0:
                try:
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    os.dup2(out, 1)
                    os.dup2(out, 2)
                    os.execvpe(req['argv'][0], req['argv'], env)
                finally:
                    os._exit(127)
            os.close(out)
            return {'pid': pid}
        if op == 'wait':
            return {'status': wait_for(req['pid'], req.get('timeout', 10))}
        if op == 'mkdir':
            os.mkdir(path)
            return {}
        if op == 'rmdir':
            os.rmdir(path)
            return {}
        if op == 'stat':
            st = os.stat(path)
            return {'mode': st.st_mode, 'ino': st.st_ino, 'uid': st.st_uid}
        if op == 'listdir':
            return {'names': sorted(os.listdir(path))}
        if op == 'read':
            with open(path, 'rb') as f:
                return {'data': f.read().decode(errors='replace')}
        if op == 'wait_children':
            deadline = time.monotonic() + req.get('timeout', 10)
            while True:
                reap_all()
                try:
                    with open(f'/proc/self/task/{os.getpid()}/children') as f:
                        left = len(f.read().split())
                except OSError:
                    left = 0
                if left == 0 or time.monotonic() > deadline:
                    return {'left': left}
                time.sleep(0.01)
        if op == 'info':
            return {'pid': os.getpid()}
        raise ValueError(op)
    except OSError as e:
        return {'errno': e.errno}


def main():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(json.dumps({'error': 'prctl(PR_SET_CHILD_SUBREAPER) failed'}), flush=True)
        return 1
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    setup = sys.argv[1] if len(sys.argv) > 1 else ''
    if setup:
        r = subprocess.run(['/bin/sh', '-ec', setup], stdin=subprocess.DEVNULL,
                           capture_output=True)
        if r.returncode != 0:
            print(json.dumps({'error': f'setup failed ({r.returncode}): '
                                       f'{r.stderr.decode(errors="replace")}'}), flush=True)
            return 1
    print(json.dumps({'ready': os.getpid()}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        if req['op'] == 'exit':
            break
        res = serve(req)
        reap_all()
        sys.stdout.write(json.dumps(res) + '\n')
        sys.stdout.flush()
    return 0


if __name__ == '__main__':
    sys.exit(main())
