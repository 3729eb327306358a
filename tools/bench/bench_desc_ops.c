/*
 * bench_desc_ops: the work descendant tracking adds, without FUSE, in CPU
 * time (tools/bench/bench_descendants.sh; a loaded machine disturbs CPU time
 * far less than wall time).
 *
 *   bench_desc_ops pair N
 *       N times what an uncontended mkdir+rmdir pair adds to the daemon:
 *       lockfs_descendants_watch + _unwatch of this process (the tracker
 *       fed by the connector, as in the daemon).  Prints ns per pair.
 *   bench_desc_ops drain N
 *       N times fork + _exit + waitpid of a child nobody tracks (while one
 *       holder is watched), then one tick: the events of the machine's
 *       forks and exits, read and dropped.  Prints the tick's ns per event
 *       read, then per fork made (a fork makes two events; other
 *       processes' events count too).
 *
 * Exit status 1, with a message, when the connector is unavailable or a
 * call fails.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lockfs/descendants.h"
#include "lockfs/procevents.h"

/* The connector, counting what it hands out. */
static struct lockfs_event_source inner;
static long nevents;

static int counting_read(void *ctx, struct lockfs_proc_event *evs, int max)
{
	int n = inner.read(ctx, evs, max);

	nevents += n > 0 ? n : 0;
	return n;
}

static double cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char *argv[])
{
	struct lockfs_procevents *pe;
	struct lockfs_descendants *d;
	struct lockfs_event_source src;
	struct lockfs_desc_proc me;
	char why[160];
	long n = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
	double t0, t1;

	if (n <= 0 || (strcmp(argv[1], "pair") != 0 && strcmp(argv[1], "drain") != 0)) {
		fprintf(stderr, "usage: %s pair|drain N\n", argv[0]);
		return 2;
	}
	if (lockfs_procevents_open(&pe, why, sizeof(why)) < 0) {
		fprintf(stderr, "bench_desc_ops: no connector: %s\n", why);
		return 1;
	}
	inner = lockfs_procevents_source(pe);
	src = (struct lockfs_event_source){ counting_read, inner.ctx };
	if (lockfs_descendants_new(&d, &src, NULL) < 0 ||
	    lockfs_desc_procs_real.stat(NULL, getpid(), &me) < 0) {
		fprintf(stderr, "bench_desc_ops: setup failed\n");
		return 1;
	}
	if (strcmp(argv[1], "pair") == 0) {
		for (int i = 0; i < 1000; i++) { /* warm-up */
			if (lockfs_descendants_watch(d, me.pid, me.start, me.sid, false) < 0)
				return 1;
			lockfs_descendants_unwatch(d, me.pid, me.start);
		}
		t0 = cpu_ns();
		for (long i = 0; i < n; i++) {
			if (lockfs_descendants_watch(d, me.pid, me.start, me.sid, false) < 0) {
				fprintf(stderr, "bench_desc_ops: watch failed\n");
				return 1;
			}
			lockfs_descendants_unwatch(d, me.pid, me.start);
		}
		t1 = cpu_ns();
	} else {
		/* A holder is watched (its parent: not us, so our children are
		 * not its descendants), as in a daemon with a lock held. */
		struct lockfs_desc_proc parent;

		if (lockfs_desc_procs_real.stat(NULL, getppid(), &parent) < 0 ||
		    lockfs_descendants_watch(d, parent.pid, parent.start, parent.sid, false) < 0)
			return 1;
		lockfs_descendants_tick(d);
		for (long i = 0; i < n; i++) {
			pid_t c = fork();

			if (c == 0)
				_exit(0);
			if (c < 0 || waitpid(c, NULL, 0) != c) {
				fprintf(stderr, "bench_desc_ops: fork: %s\n", strerror(errno));
				return 1;
			}
		}
		nevents = 0;
		t0 = cpu_ns();
		lockfs_descendants_tick(d);
		t1 = cpu_ns();
		printf("%.1f ns per event (%ld events)\n", (t1 - t0) / (nevents ? nevents : 1),
		       nevents);
		if (lockfs_descendants_count(d, parent.pid, parent.start, NULL) != 0) {
			fprintf(stderr, "bench_desc_ops: an untracked child was counted\n");
			return 1;
		}
		lockfs_descendants_unwatch(d, parent.pid, parent.start);
	}
	printf("%.1f\n", (t1 - t0) / n);
	lockfs_descendants_free(d);
	lockfs_procevents_close(pe);
	return 0;
}
