/*
 * A holder as lockctl can see it from where it runs: its pid in lockctl's
 * own pid namespace (or none, when it lives outside it), and what keeps a
 * lock whose holder exited.
 *
 * The record names a holder by its pid in the daemon's pid namespace
 * (`pid`), its pid in its own (`ns_pid`) and its start time.  Inside a
 * container, the host's pid is nobody's, or another process's: a pid is
 * shown only when lockctl's own /proc shows that very process there (the
 * same start time), never a host pid as if it were the container's.
 */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lockctl.h"

/* Start time (field 22) and comm of PID in our /proc: true when it exists. */
static bool proc_here(long long pid, unsigned long long *start, char *comm, size_t size)
{
	char path[64], buf[1024];
	FILE *f;
	size_t n;

	if (pid <= 0 || pid > INT_MAX)
		return false;
	snprintf(path, sizeof(path), "/proc/%lld/stat", pid);
	f = fopen(path, "re");
	if (!f)
		return false;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *open = strchr(buf, '('), *close = strrchr(buf, ')');
	if (!open || !close || close < open)
		return false;
	if (comm) {
		size_t len = (size_t)(close - open - 1);
		if (len >= size)
			len = size - 1;
		memcpy(comm, open + 1, len);
		comm[len] = '\0';
	}
	/* After ") ": state is field 3; start time is field 22. */
	char *p = close + 2;
	for (int field = 3; field < 22 && p; field++) {
		p = strchr(p, ' ');
		if (p)
			p++;
	}
	return p && sscanf(p, "%llu", start) == 1;
}

/* H's pid here (see lockfs_ctl_pid_here) and, when COMM, its name now. */
static bool here(const json_t *h, long long *pid, char *comm, size_t size)
{
	long long start, cand[2];
	unsigned long long now;

	if (!h || !lockfs_ctl_jint(h, "start_time", &start))
		return false;
	cand[0] = 0;
	cand[1] = 0;
	lockfs_ctl_jint(h, "ns_pid", &cand[0]);
	lockfs_ctl_jint(h, "pid", &cand[1]);
	for (int i = 0; i < 2; i++)
		if (proc_here(cand[i], &now, comm, size) && now == (unsigned long long)start) {
			*pid = cand[i];
			return true;
		}
	return false;
}

bool lockfs_ctl_pid_here(const json_t *h, long long *pid)
{
	return here(h, pid, NULL, 0);
}

/* The first process in our /proc that has M/.flock/NAME open: "comm[pid]"
 * into BUF, true when one is found.  readlink of /proc/PID/fd/N reads no
 * file system; other users' descriptors are unreadable unless root. */
static bool fd_keeper(const char *mnt, const char *name, char *buf, size_t size)
{
	char want[PATH_MAX], real[PATH_MAX];
	DIR *procs;
	struct dirent *pe;
	bool found = false;

	if (!realpath(mnt, real) ||
	    (size_t)snprintf(want, sizeof(want), "%s/.flock/%s", real, name) >= sizeof(want))
		return false;
	procs = opendir("/proc");
	if (!procs)
		return false;
	while (!found && (pe = readdir(procs))) {
		char dir[300], comm[64];
		unsigned long long start;
		struct dirent *fe;
		DIR *fds;

		if (pe->d_name[0] < '1' || pe->d_name[0] > '9' || strlen(pe->d_name) > 20)
			continue;
		snprintf(dir, sizeof(dir), "/proc/%s/fd", pe->d_name);
		fds = opendir(dir);
		if (!fds)
			continue;
		while (!found && (fe = readdir(fds))) {
			char link[sizeof(dir) + 260], target[PATH_MAX];
			ssize_t n;

			if (fe->d_name[0] == '.')
				continue;
			snprintf(link, sizeof(link), "%s/%s", dir, fe->d_name);
			n = readlink(link, target, sizeof(target) - 1);
			if (n <= 0)
				continue;
			target[n] = '\0';
			if (strcmp(target, want) == 0 &&
			    proc_here(atoll(pe->d_name), &start, comm, sizeof(comm))) {
				snprintf(buf, size, "%.63s[%.20s]", comm, pe->d_name);
				found = true;
			}
		}
		closedir(fds);
	}
	closedir(procs);
	return found;
}

char *lockfs_ctl_holder_note(const char *mnt, const char *name, const json_t *owner,
			     const json_t *h, bool brief)
{
	const char *bound = lockfs_ctl_jstr(owner, "bound");
	json_t *desc = json_object_get(owner, "descendants");
	long long pid;

	if (!h)
		return NULL;
	if (json_is_true(json_object_get(owner, "holder_exited"))) {
		/* A process-bound lock kept by processes its holder started. */
		const json_t *d = json_array_get(desc, 0);
		size_t more = json_array_size(desc) > 1 ? json_array_size(desc) - 1 : 0;
		const char *comm = lockfs_ctl_jstr(d, "comm");
		char keeper[128], now[64];

		/* Its name now: the record's is from when it was last looked
		 * at, often the shell it was forked from. */
		if (d && here(d, &pid, now, sizeof(now)))
			snprintf(keeper, sizeof(keeper), "%s[%lld]", now, pid);
		else
			snprintf(keeper, sizeof(keeper), "%s", d && comm ? comm : "?");
		if (brief)
			return more ? xasprintf("(exited,kept:%s+%zu)", keeper, more)
				    : xasprintf("(exited,kept:%s)", keeper);
		if (more)
			return xasprintf("(exited; kept by %s and %zu more)", keeper, more);
		return xasprintf("(exited; kept by %s)", keeper);
	}
	if (lockfs_ctl_pid_here(h, &pid))
		return NULL;
	if (bound && strcmp(bound, "fd") == 0) {
		/* The opener is gone (or outside): who still has the file? */
		char keeper[128];

		if (fd_keeper(mnt, name, keeper, sizeof(keeper)))
			return brief ? xasprintf("(gone,fd:%s)", keeper)
				     : xasprintf("(opener gone; fd open in %s)", keeper);
		return brief ? xasprintf("(gone,fd:unknown)")
			     : xasprintf("(opener gone or outside this pid namespace; "
					 "fd holder unknown)");
	}
	return brief ? xasprintf("(outside)") : xasprintf("(outside this pid namespace)");
}
