/*
 * Stopping on SIGTERM or SIGINT in bounded time.
 *
 * libfuse 3.14's handler only sets the session's exit flag.  The loop sees
 * it when the signal interrupts the loop's thread where it sleeps
 * (sem_wait in the multi-threaded loop, read(/dev/fuse) with -s).  A signal
 * that lands between the loop's test of the flag and that sleep is
 * consumed without waking it, and the daemon then stays up until the next
 * request arrives -- forever on an idle mount (libfuse issue #997, fixed
 * in 3.18).  The window is tiny but widens when the host is loaded.  So
 * our handler also wakes a thread of ours (a pipe: async-signal-safe),
 * which interrupts the loop's thread every KICK_MS until the loop has
 * returned: a kick that lands in the window is followed by one that does
 * not.
 *
 * The handler also marks the daemon as stopping in its store's state
 * directory (lockfs_backend_mark_stopping), so that a new daemon started
 * right after `kill -TERM` waits for this one to let go of DIR instead of
 * refusing; the end of the loop does the same for a stop by unmount.
 *
 * State is static because a signal handler can reach nothing else; there
 * is one session per process.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/backend.h"
#include "stop.h"

#define KICK_MS 10

static struct fuse_session *stop_se;
static const struct lockfs_backend *stop_be;
static volatile sig_atomic_t stop_signal;  /* the first stop signal, or 0 */
static int stop_pipe[2] = { -1, -1 };   /* written by the handler */
static pthread_t loop_thread, kicker;
static bool kicker_running;              /* main thread only */
static atomic_bool loop_done;
static volatile sig_atomic_t handover;     /* SIGUSR2 came: hand over */

static void on_stop_signal(int sig)
{
	int saved = errno;
	char c = (char)sig;

	/* Once the loop has ended the session may be gone: ignore repeats. */
	if (atomic_load(&loop_done))
		return;
	if (!stop_signal)
		stop_signal = sig;
	lockfs_backend_mark_stopping(stop_be);
	fuse_session_exit(stop_se);
	/* Nonblocking: a full pipe already holds a wake-up. */
	if (write(stop_pipe[1], &c, 1) < 0) {
		/* nothing to do in a signal handler */
	}
	errno = saved;
}

/* SIGUSR2 (`lockfs --upgrade`): end the loop as a stop does, but without
 * marking the daemon as stopping: its successor takes the connection. */
static void on_handover_signal(int sig)
{
	int saved = errno;
	char c = (char)sig;

	if (atomic_load(&loop_done) || stop_signal)
		return;
	handover = 1;
	/* Not marked stopping: the successor must not wait for us. */
	fuse_session_exit(stop_se);
	if (write(stop_pipe[1], &c, 1) < 0) {
		/* nothing to do in a signal handler */
	}
	errno = saved;
}

int lockfs_stop_install_handover(void)
{
	struct sigaction sa;

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_handover_signal;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGUSR2, &sa, NULL) < 0 ? -errno : 0;
}

bool lockfs_stop_handover(void)
{
	return handover && !stop_signal;
}

int lockfs_stop_install(struct fuse_session *se, const struct lockfs_backend *be)
{
	struct sigaction sa;

	if (pipe2(stop_pipe, O_CLOEXEC | O_NONBLOCK) < 0)
		return -errno;
	stop_se = se;
	stop_be = be;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop_signal;
	sigemptyset(&sa.sa_mask);
	/* No SA_RESTART: the loop's sleep must end with EINTR. */
	if (sigaction(SIGTERM, &sa, NULL) < 0 || sigaction(SIGINT, &sa, NULL) < 0)
		return -errno;
	return 0;
}

static void drain(void)
{
	char buf[64];

	while (read(stop_pipe[0], buf, sizeof(buf)) > 0)
		;
}

static void *kicker_main(void *arg)
{
	struct pollfd pfd = { .fd = stop_pipe[0], .events = POLLIN };
	const struct timespec tick = { 0, KICK_MS * 1000000L };

	/* Sleep until a stop signal, or until the loop ended another way. */
	while (!atomic_load(&loop_done) && poll(&pfd, 1, -1) < 0 && errno == EINTR)
		;
	while (!atomic_load(&loop_done)) {
		drain();
		/* A hand-over's kick must not turn it into a stop. */
		pthread_kill(loop_thread, handover && !stop_signal ? SIGUSR2 : SIGTERM);
		nanosleep(&tick, NULL);
	}
	return arg;
}

int lockfs_stop_start(void)
{
	int rc;

	loop_thread = pthread_self();
	rc = pthread_create(&kicker, NULL, kicker_main, NULL);
	if (rc)
		return -rc;
	kicker_running = true;
	return 0;
}

void lockfs_stop_loop_ended(void)
{
	char c = 0;

	atomic_store(&loop_done, true);
	if (stop_be)
		lockfs_backend_mark_stopping(stop_be);
	if (!kicker_running)
		return;
	if (write(stop_pipe[1], &c, 1) < 0) {
		/* full: the kicker wakes up anyway */
	}
	pthread_join(kicker, NULL);
	kicker_running = false;
}

int lockfs_stop_signal(void)
{
	return stop_signal;
}
