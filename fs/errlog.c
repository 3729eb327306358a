/*
 * Where the daemon's own warnings and errors go.
 *
 * Every message of the daemon (and of libfuse) is an fprintf(stderr, ...)
 * line.  That is right in the foreground, and wrong once the detached
 * daemon (daemonize.c) has pointed fd 2 at /dev/null.  Rather than touch each message, stderr
 * itself is replaced by a stdio stream that cuts what is written into lines
 * and hands each complete line, with a priority read from its text, to a
 * sink:
 *
 *   - detached: syslog(3) as "lockfs[PID]", facility daemon (journald, or
 *     any syslog daemon, picks it up from /dev/log); when nothing listens
 *     on /dev/log, the messages file DIR/daemon.log (msgfile.c), where
 *     syslog(3) would drop every line;
 *   - in the foreground with stderr connected to the journal
 *     ($JOURNAL_STREAM names fd 2): the line prefixed "<N>", which journald
 *     reads as the priority (SyslogLevelPrefix=, on by default).
 *
 * Priority from the text (after an optional "lockfs: "): "warning: " is
 * LOG_WARNING, "notice: " LOG_NOTICE, "info: " LOG_INFO, anything else
 * LOG_ERR.  Messages of other modules follow automatically as long as they
 * keep writing whole lines to stderr.
 *
 * Locking: the stream's state is touched only from its write callback,
 * which stdio calls with the FILE's own lock held.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/uio.h>
#include <syslog.h>
#include <unistd.h>

#include "service.h"

#define PREFIX "lockfs: "
/* A longer line is handed on in pieces of this size. */
#define LINE_MAX_BYTES 2048

struct line_stream {
	lockfs_errlog_sink sink;
	void *sink_arg;
	size_t len;			/* bytes of an unfinished line in buf */
	char buf[LINE_MAX_BYTES + 1];
};

int lockfs_errlog_priority(const char *line)
{
	static const struct {
		const char *word;
		int prio;
	} words[] = {
		{ "warning: ", LOG_WARNING },
		{ "notice: ", LOG_NOTICE },
		{ "info: ", LOG_INFO },
	};

	if (strncmp(line, PREFIX, strlen(PREFIX)) == 0)
		line += strlen(PREFIX);
	for (size_t i = 0; i < sizeof(words) / sizeof(words[0]); i++)
		if (strncmp(line, words[i].word, strlen(words[i].word)) == 0)
			return words[i].prio;
	return LOG_ERR;
}

static void emit(struct line_stream *ls)
{
	ls->buf[ls->len] = '\0';
	if (ls->len > 0)
		ls->sink(lockfs_errlog_priority(ls->buf), ls->buf, ls->sink_arg);
	ls->len = 0;
}

static ssize_t line_write(void *cookie, const char *data, size_t size)
{
	struct line_stream *ls = cookie;

	for (size_t i = 0; i < size; i++) {
		if (data[i] == '\n') {
			emit(ls);
			continue;
		}
		if (ls->len == LINE_MAX_BYTES)
			emit(ls);
		ls->buf[ls->len++] = data[i];
	}
	return (ssize_t)size;
}

static int line_close(void *cookie)
{
	struct line_stream *ls = cookie;

	emit(ls);
	free(ls);
	return 0;
}

/* The stream and, in *STATE, its state.  NULL when out of memory. */
static FILE *open_stream(lockfs_errlog_sink sink, void *arg, struct line_stream **state)
{
	static const cookie_io_functions_t io = { .write = line_write, .close = line_close };
	struct line_stream *ls = calloc(1, sizeof(*ls));
	FILE *f;

	if (!ls)
		return NULL;
	ls->sink = sink;
	ls->sink_arg = arg;
	f = fopencookie(ls, "w", io);
	if (!f) {
		free(ls);
		return NULL;
	}
	/* One line, one message: flushed at each newline. */
	setvbuf(f, NULL, _IOLBF, 0);
	*state = ls;
	return f;
}

FILE *lockfs_errlog_stream(lockfs_errlog_sink sink, void *arg)
{
	struct line_stream *state;

	return open_stream(sink, arg, &state);
}

static void to_syslog(int prio, const char *line, void *arg)
{
	(void)arg;
	/* The ident already says lockfs. */
	if (strncmp(line, PREFIX, strlen(PREFIX)) == 0)
		line += strlen(PREFIX);
	syslog(prio, "%s", line);
}

/* The journal reads "<N>" in front of a line as its priority. */
static void to_journal(int prio, const char *line, void *arg)
{
	int fd = *(int *)arg;
	char head[8];
	int n = snprintf(head, sizeof(head), "<%d>", prio);
	struct iovec iov[] = {
		{ .iov_base = head, .iov_len = (size_t)n },
		{ .iov_base = (void *)line, .iov_len = strlen(line) },
		{ .iov_base = (void *)"\n", .iov_len = 1 },
	};

	/* One write per line: lines of concurrent writers never interleave.
	 * A lost message has nowhere else to go. */
	if (writev(fd, iov, 3) < 0) {
		/* nothing to do */
	}
}

/* Is fd 2 the stream $JOURNAL_STREAM ("DEV:INODE") names? */
static bool stderr_is_journal(void)
{
	const char *js = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2 || fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

/* The state of the stream installed as stderr, kept here so that
 * LeakSanitizer sees it reachable: it does not look through glibc's FILE
 * to the cookie. */
static struct line_stream *ours_state;

/*
 * Make a stream to SINK the process's stderr, closing our previous one.
 * Called before any thread starts (nothing else uses stderr meanwhile).
 * Returns 0 or -ENOMEM (stderr unchanged).
 */
static int replace_stderr(lockfs_errlog_sink sink, void *arg)
{
	static FILE *ours;
	struct line_stream *state;
	FILE *f = open_stream(sink, arg, &state);

	if (!f)
		return -ENOMEM;
	fflush(stderr);
	if (ours)
		fclose(ours);
	ours = stderr = f;
	ours_state = state;
	return 0;
}

int lockfs_errlog_start(void)
{
	static int journal_fd = STDERR_FILENO;

	if (!stderr_is_journal())
		return 0;
	return replace_stderr(to_journal, &journal_fd);
}

/* Does a syslog daemon listen on /dev/log?  (syslog(3) itself tells
 * nobody when it drops a message.) */
static bool syslog_listens(void)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX, .sun_path = "/dev/log" };
	static const int types[] = { SOCK_DGRAM, SOCK_STREAM };

	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		int fd = socket(AF_UNIX, types[i] | SOCK_CLOEXEC, 0);
		int rc;

		if (fd < 0)
			continue;
		rc = connect(fd, (struct sockaddr *)&addr, sizeof(addr));
		close(fd);
		if (rc == 0)
			return true;
	}
	return false;
}

/* Before detaching, without syslog: the line to the caller's stderr, as
 * ever, and to the messages file, so that what a start says (a dead mount
 * detached, a predecessor that crashed) is kept there too. */
static void to_caller_and_file(int prio, const char *line, void *arg)
{
	int fd = *(int *)arg;
	struct iovec iov[] = {
		{ .iov_base = (void *)line, .iov_len = strlen(line) },
		{ .iov_base = (void *)"\n", .iov_len = 1 },
	};

	if (writev(fd, iov, 2) < 0) {
		/* the caller is gone; the file still has it */
	}
	lockfs_msgfile_line(prio, line, NULL);
}

static bool to_file;        /* no syslog: the messages file is open */
static int caller_fd = -1;  /* the caller's stderr, until detached */

void lockfs_errlog_store_open(int dirfd)
{
	if (syslog_listens() || lockfs_msgfile_open(dirfd) < 0)
		return;
	to_file = true;
	/* Our own copy of the caller's stderr: fd 2 becomes /dev/null when
	 * the start is over (lockfs_daemonize_done). */
	caller_fd = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3);
	if (caller_fd < 0 || replace_stderr(to_caller_and_file, &caller_fd) < 0)
		return;
}

int lockfs_errlog_detach(int dirfd)
{
	int rc;

	if (!to_file && syslog_listens()) {
		openlog("lockfs", LOG_PID, LOG_DAEMON);
		return replace_stderr(to_syslog, NULL);
	}
	rc = to_file ? 0 : lockfs_msgfile_open(dirfd);
	if (rc < 0) {
		/* Said while stderr is still the caller's. */
		fprintf(stderr, "lockfs: warning: no syslog on /dev/log, and %s cannot be "
			"written (%s): the daemon's messages are lost\n", LOCKFS_MSGFILE,
			strerror(-rc));
		return rc;
	}
	rc = replace_stderr(lockfs_msgfile_line, NULL);
	/* The caller waits for the end of our copy of its stderr (`$(lockfs
	 * ...)`): it must go with the start, like fd 2 itself. */
	if (rc == 0 && caller_fd >= 0) {
		close(caller_fd);
		caller_fd = -1;
	}
	return rc;
}
