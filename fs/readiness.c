/*
 * Readiness for a service manager: systemd's Type=notify.
 *
 * The unit runs `lockfs -f`; systemd starts the units that come after it
 * once READY=1 arrives on $NOTIFY_SOCKET, so it is sent only when the mount
 * is in place and the daemon is about to serve it (after fuse_session_mount,
 * after detaching, after the threads started).  STOPPING=1 says the daemon
 * is on its way out.  Without $NOTIFY_SOCKET these do nothing.
 *
 * libsystemd is optional (meson: -Dsystemd=disabled); a daemon built
 * without it says so once when $NOTIFY_SOCKET asks for readiness it cannot
 * send, since systemd would otherwise wait for it until its start timeout.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "service.h"

#ifdef LOCKFS_HAVE_LIBSYSTEMD
#include <systemd/sd-daemon.h>

/* Send TEXT; a failure is one warning line (the service manager would
 * otherwise wait in silence). */
static void notify(const char *text)
{
	int rc = sd_notify(0, text);

	if (rc < 0)
		fprintf(stderr, "lockfs: warning: cannot notify the service manager (%s): %s\n",
			getenv("NOTIFY_SOCKET"), strerror(-rc));
}

void lockfs_notify_ready(const char *mountpoint, const char *backing)
{
	char *text = NULL;

	if (!getenv("NOTIFY_SOCKET"))
		return;
	/* MAINPID: this process, also when it detached from the one systemd
	 * started (Type=notify with NotifyAccess=all and no -f). */
	if (asprintf(&text, "READY=1\nMAINPID=%ld\nSTATUS=Serving %s (backing dir %s)",
		     (long)getpid(), mountpoint, backing) < 0) {
		notify("READY=1");
		return;
	}
	notify(text);
	free(text);
}

void lockfs_notify_stopping(void)
{
	if (getenv("NOTIFY_SOCKET"))
		notify("STOPPING=1\nSTATUS=Stopping");
}

#else

void lockfs_notify_ready(const char *mountpoint, const char *backing)
{
	(void)mountpoint;
	(void)backing;
	if (getenv("NOTIFY_SOCKET"))
		fprintf(stderr, "lockfs: warning: NOTIFY_SOCKET is set but this lockfs was built "
			"without libsystemd: no READY=1 is sent (use Type=exec or rebuild with "
			"libsystemd-dev)\n");
}

void lockfs_notify_stopping(void)
{
}

#endif
