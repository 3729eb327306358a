/* The daemon as a system service: readiness for systemd and where its own
 * messages go (fs/readiness.c, fs/errlog.c). */
#ifndef LOCKFS_SERVICE_H
#define LOCKFS_SERVICE_H

#include <stdio.h>

/* Send READY=1 (with MAINPID and a STATUS naming MOUNTPOINT and BACKING)
 * to $NOTIFY_SOCKET, if set.  Call once the mount is in place and the
 * daemon is about to serve it.  Failures are one warning on stderr. */
void lockfs_notify_ready(const char *mountpoint, const char *backing);
/* Send STOPPING=1 to $NOTIFY_SOCKET, if set. */
void lockfs_notify_stopping(void);

/* Receives one complete line (no newline) and its syslog priority. */
typedef void (*lockfs_errlog_sink)(int prio, const char *line, void *arg);

/* The syslog priority of a message LINE: after an optional "lockfs: ",
 * "warning: " is LOG_WARNING, "notice: " LOG_NOTICE, "info: " LOG_INFO,
 * anything else LOG_ERR. */
int lockfs_errlog_priority(const char *line);
/* A write-only stream that hands every complete line written to it to
 * SINK (lines longer than 2048 bytes in pieces; the rest of an unfinished
 * line at fclose).  Returns NULL when out of memory. */
FILE *lockfs_errlog_stream(lockfs_errlog_sink sink, void *arg);
/* At startup: when fd 2 is the journal ($JOURNAL_STREAM), replace stderr
 * by a stream that prefixes each line with its "<N>" priority.
 * Returns 0 (also when there is nothing to do) or -ENOMEM. */
int lockfs_errlog_start(void);
/* Right after detaching (lockfs_daemonize; fd 2 is the caller's until
 * lockfs_daemonize_done points it at /dev/null), before any thread starts:
 * replace stderr by a stream to syslog ("lockfs[PID]", LOG_DAEMON) when
 * /dev/log takes messages, else to the messages file DIR/daemon.log (DIRFD
 * is DIR).  Returns 0 or -errno (stderr then stays /dev/null). */
int lockfs_errlog_detach(int dirfd);

/* A detached daemon, once its store is open (DIRFD is its state dir), when
 * nothing listens on /dev/log: open DIR/daemon.log and copy every line to
 * it as well as to the caller's stderr, until lockfs_errlog_detach. */
void lockfs_errlog_store_open(int dirfd);

/* The messages file of a detached daemon without syslog (msgfile.c). */
#define LOCKFS_MSGFILE "daemon.log"
/* Open DIR/daemon.log (DIRFD is DIR; the file is made 0600 when missing).
 * 0 or -errno. */
int lockfs_msgfile_open(int dirfd);
/* An errlog sink: append LINE to it with a time stamp and "lockfs[PID]: ",
 * keeping it under 1 MiB (the older lines in daemon.log.1). */
void lockfs_msgfile_line(int prio, const char *line, void *arg);

#endif
