/*
 * bench_handoff: the C client of the issue-4 benchmark (tools/bench/bench_handoff.sh).
 *
 *   bench_handoff handoff N SETTLE_US FILE PARKED [FILE2 PARKED2]...
 *       Hand-off latency through flock(2) on FILE, N timed samples.  Two
 *       processes, each with its own open file description of FILE: the
 *       holder takes flock(LOCK_EX); the waiter calls flock(LOCK_EX) and
 *       blocks; once the waiter is known to be parked (PARKED, below) and
 *       SETTLE_US more microseconds have passed, the holder
 *       reads CLOCK_MONOTONIC and calls flock(LOCK_UN); the waiter reads
 *       CLOCK_MONOTONIC as soon as its flock returns.  A sample is the
 *       difference.  The waiter then unlocks, and the next sample starts.
 *       PARKED is how the holder knows the waiter is queued:
 *         proc      a blocked FLOCK request of the waiter's pid in /proc/locks
 *                   (kernel flock(2));
 *         sleep     no check, a fixed 2 ms (plus SETTLE_US);
 *         any path  a file listing the queued waiters one per line, as
 *                   lockfs's M/NAME/waiters does: parked once it is not
 *                   empty (the waiter is the only one; a line without the
 *                   waiter's pid is reported once on stderr).
 *       FILE may be HOLDER_FILE=WAITER_FILE: the waiter opens another path
 *       of the same lock, e.g. the lock's M/.flock/NAME on another lockfs
 *       host (issue 11: a hand-off across hosts on one etcd).
 *       With several FILE PARKED pairs (up to 4), each has its own holder
 *       descriptor and waiter process, and the samples alternate between
 *       them one by one (A B, B A, A B, ...), so that they share the same
 *       moments of a noisy machine; each output line has one column per
 *       FILE.
 *   bench_handoff poll LOCKDIR N INTERVAL_MS
 *       The seed tool's protocol: the holder owns LOCKDIR (mkdir); the
 *       waiter tries mkdir(LOCKDIR) every INTERVAL_MS until it succeeds.
 *       Once the waiter has failed at least once, the holder waits a
 *       uniformly random part of one interval (so that releases fall at
 *       every phase of the poll), reads the clock and calls rmdir.  A
 *       sample ends when the waiter's mkdir succeeds.
 *   bench_handoff herd FILE AGENTS ROUNDS
 *       AGENTS forked processes, each with its own open file description of
 *       FILE, start together and loop ROUNDS times { flock(LOCK_EX); record
 *       the grant; flock(LOCK_UN) }.  Prints one line: the total time in ms
 *       (gate opened -> last agent done) followed by, for each agent, how
 *       many of the first quarter of all grants (by acquisition order) it
 *       got.  Mutual exclusion is checked on every grant.
 *
 * handoff and poll print the N latencies in µs on stdout, one line each, after
 * an untimed warm-up.  Any failing call, a waiter that never parks, or a lock
 * that is never handed over (timeout: LOCKFS_BENCH_TIMEOUT seconds, default
 * 30) aborts the run with a message on stderr and exit status 1, so an error
 * path is never timed.  Child processes die with their parent
 * (PR_SET_PDEATHSIG).  Times come from clock_gettime(CLOCK_MONOTONIC).
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_AGENTS 1024
#define MAX_SAMPLES 1000000

static int timeout_s = 30;

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s handoff N SETTLE_US FILE[=WAITER_FILE] proc|sleep|WAITERS_FILE [FILE PARKED]...\n"
		"       %s poll LOCKDIR N INTERVAL_MS\n"
		"       %s herd FILE AGENTS ROUNDS\n",
		prog, prog, prog);
	exit(2);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

static void sleep_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

/* Returns the integer in S within MIN..MAX, or exits with a usage error. */
static long parse_long(const char *s, const char *what, long min, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || end == s || v < min || v > max) {
		fprintf(stderr, "bench_handoff: bad %s '%s' (%ld..%ld)\n", what,
			s, min, max);
		exit(2);
	}
	return v;
}

static long warmup_count(long n)
{
	long w = n / 10;

	return w < 2 ? 2 : w > 20 ? 20 : w;
}

static void on_alarm(int sig)
{
	(void) sig;
}

/*
 * In a child: die with the parent, and let a blocked call return EINTR
 * after timeout_s seconds (SIGALRM without SA_RESTART).  Returns 0 or -1.
 */
static int child_setup(void)
{
	struct sigaction sa;

	if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
		return -1;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_alarm;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGALRM, &sa, NULL);
}

/* Reads one byte from FD within timeout_s seconds. Returns it, or -1. */
static int read_byte(int fd, const char *who)
{
	struct pollfd p = { .fd = fd, .events = POLLIN };
	char c;
	int r;

	do
		r = poll(&p, 1, timeout_s * 1000);
	while (r < 0 && errno == EINTR);
	if (r == 0) {
		fprintf(stderr, "bench_handoff: no word from the %s within %d s\n",
			who, timeout_s);
		return -1;
	}
	if (r < 0 || read(fd, &c, 1) != 1) {
		fprintf(stderr, "bench_handoff: the %s went away\n", who);
		return -1;
	}
	return (unsigned char) c;
}

static int write_byte(int fd, char c)
{
	return write(fd, &c, 1) == 1 ? 0 : -1;
}

static void kill_and_reap(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* ------------------------------------------------------ parked checks --- */

/* Does /proc/locks show a blocked FLOCK request of PID? 1, 0, or -1. */
static int flock_blocked_in_proc_locks(pid_t pid)
{
	char line[256];
	FILE *f = fopen("/proc/locks", "re");
	int found = 0;

	if (!f)
		return -1;
	/* "12: -> FLOCK  ADVISORY  WRITE 1235 00:2a:5 0 EOF" */
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "-> FLOCK");
		int lpid;

		if (p && sscanf(p, "-> FLOCK %*s %*s %d", &lpid) == 1 &&
		    lpid == (int) pid) {
			found = 1;
			break;
		}
	}
	fclose(f);
	return found;
}

/*
 * Does WAITERS (lockfs's M/NAME/waiters) list a waiter?  1, 0, or -1 after a
 * message.  The first time a listed waiter is not PID, says so on stderr.
 */
static int waiter_listed(const char *waiters, pid_t pid)
{
	static int warned;
	char buf[4096], *p;
	ssize_t n;
	int fd;

	fd = open(waiters, O_RDONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT)
		return 0; /* M/NAME not there yet: another host's lock, not yet seen */
	if (fd < 0) {
		fprintf(stderr, "bench_handoff: open %s: %s\n", waiters,
			strerror(errno));
		return -1;
	}
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n < 0) {
		fprintf(stderr, "bench_handoff: read %s: %s\n", waiters,
			strerror(errno));
		return -1;
	}
	if (n == 0)
		return 0;
	buf[n] = '\0';
	p = strstr(buf, "\"pid\"");
	if (!warned) {
		long lpid = -1;

		if (p && (p = strchr(p, ':')))
			lpid = strtol(p + 1, NULL, 10);
		if (lpid != (long) pid) {
			warned = 1;
			fprintf(stderr,
				"bench_handoff: note: %s lists pid %ld, the waiter is %d: %.*s\n",
				waiters, lpid, (int) pid, (int) strcspn(buf, "\n"),
				buf);
		}
	}
	return 1;
}

/*
 * Waits until the waiter PID is parked, as PARKED says (see the header).
 * Returns 0, or -1 after a message.
 */
static int wait_parked(const char *parked, pid_t pid)
{
	double deadline = now_s() + timeout_s;
	int r;

	if (strcmp(parked, "sleep") == 0) {
		sleep_us(2000);
		return 0;
	}
	for (;;) {
		if (strcmp(parked, "proc") == 0)
			r = flock_blocked_in_proc_locks(pid);
		else
			r = waiter_listed(parked, pid);
		if (r != 0)
			return r > 0 ? 0 : -1;
		if (now_s() > deadline) {
			fprintf(stderr,
				"bench_handoff: the waiter (pid %d) was not parked within %d s (%s)\n",
				(int) pid, timeout_s, parked);
			return -1;
		}
		sleep_us(20);
	}
}

/* --------------------------------------------------------- hand-off --- */

/* Written by the waiter before it signals the holder. */
struct ho_shared {
	double t_return;   /* waiter: just after its lock call returned */
	atomic_int trying; /* poll waiter: 1 after its first failed mkdir */
};

enum { GO = 'g', QUIT = 'q', DONE = 'd' };

/*
 * The waiter's side of one hand-off through flock on FD: block, take the
 * time, unlock.  Returns 0 or -1 after a message.
 */
static int flock_waiter_sample(int fd, struct ho_shared *sh)
{
	int r;

	alarm(timeout_s);
	r = flock(fd, LOCK_EX);
	sh->t_return = now_s();
	alarm(0);
	if (r != 0) {
		fprintf(stderr, "bench_handoff: waiter flock(LOCK_EX): %s%s\n",
			strerror(errno),
			errno == EINTR ? " (never handed over: timeout)" : "");
		return -1;
	}
	if (flock(fd, LOCK_UN) != 0) {
		fprintf(stderr, "bench_handoff: waiter flock(LOCK_UN): %s\n",
			strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * The seed's waiter: mkdir DIR every INTERVAL_US until it succeeds, then
 * take the time and rmdir.  Returns 0 or -1 after a message.
 */
static int poll_waiter_sample(const char *dir, long interval_us,
			      struct ho_shared *sh)
{
	double deadline = now_s() + timeout_s;

	while (mkdir(dir, 0755) != 0) {
		if (errno != EEXIST) {
			fprintf(stderr, "bench_handoff: waiter mkdir %s: %s\n",
				dir, strerror(errno));
			return -1;
		}
		atomic_store(&sh->trying, 1);
		if (now_s() > deadline) {
			fprintf(stderr, "bench_handoff: %s never freed\n", dir);
			return -1;
		}
		sleep_us(interval_us);
	}
	sh->t_return = now_s();
	atomic_store(&sh->trying, 0);
	if (rmdir(dir) != 0) {
		fprintf(stderr, "bench_handoff: waiter rmdir %s: %s\n", dir,
			strerror(errno));
		return -1;
	}
	return 0;
}

/* The lock in a hand-off run: a flock file or a seed lock directory. */
struct ho_lock {
	const char *path;
	const char *waiter_path; /* flock: the waiter's path of the lock (PATH unless FILE=FILE2) */
	int poll;         /* seed protocol (mkdir/rmdir) instead of flock */
	const char *parked; /* flock: proc|sleep|WAITERS path */
	long settle_us;   /* flock: extra wait once parked */
	long interval_us; /* poll: the waiter's poll interval */
};

/* Body of the waiter process; never returns. */
static void waiter_main(const struct ho_lock *lk, struct ho_shared *sh,
			int go_fd, int done_fd)
{
	int fd = -1, c;

	if (child_setup() != 0)
		_exit(1);
	if (!lk->poll) {
		fd = open(lk->waiter_path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0) {
			fprintf(stderr, "bench_handoff: waiter open %s: %s\n",
				lk->waiter_path, strerror(errno));
			_exit(1);
		}
	}
	while ((c = read_byte(go_fd, "holder")) == GO) {
		if ((lk->poll ? poll_waiter_sample(lk->path, lk->interval_us, sh)
			      : flock_waiter_sample(fd, sh)) != 0 ||
		    write_byte(done_fd, DONE) != 0)
			_exit(1);
	}
	_exit(c == QUIT ? 0 : 1);
}

/*
 * The holder: take the lock uncontended. Returns 0 or -1 after a message.
 * A flock held a moment longer is waited for (untimed): across hosts the
 * holder's daemon learns of the waiter's unlock from etcd's watch.
 */
static int holder_take(const struct ho_lock *lk, int fd)
{
	double deadline = now_s() + timeout_s;
	int r;

	while ((r = lk->poll ? mkdir(lk->path, 0755) : flock(fd, LOCK_EX | LOCK_NB)) != 0 &&
	       !lk->poll && errno == EWOULDBLOCK && now_s() < deadline)
		sleep_us(100);
	if (r != 0) {
		fprintf(stderr, "bench_handoff: holder %s %s: %s\n",
			lk->poll ? "mkdir" : "flock(LOCK_EX|LOCK_NB)", lk->path,
			strerror(errno));
		return -1;
	}
	return 0;
}

/* A uniformly random number in 0..max-1 (max > 0). */
static long random_below(long max)
{
	unsigned long r;

	if (getrandom(&r, sizeof(r), 0) != sizeof(r))
		r = (unsigned long) rand();
	return (long) (r % (unsigned long) max);
}

/*
 * The holder's side of one sample: take the lock, let the waiter queue,
 * wait until it is parked, release.  Returns the latency in seconds, or a
 * negative number after a message.
 */
static double holder_sample(const struct ho_lock *lk, int fd, pid_t waiter,
			    struct ho_shared *sh, int go_fd, int done_fd)
{
	double t0;
	int r;

	if (holder_take(lk, fd) != 0 || write_byte(go_fd, GO) != 0)
		return -1;
	if (lk->poll) {
		double deadline = now_s() + timeout_s;

		while (!atomic_load(&sh->trying)) {
			if (now_s() > deadline) {
				fprintf(stderr, "bench_handoff: the waiter never polled\n");
				return -1;
			}
			sleep_us(50);
		}
		sleep_us(random_below(lk->interval_us));
	} else {
		if (wait_parked(lk->parked, waiter) != 0)
			return -1;
		sleep_us(lk->settle_us);
	}
	t0 = now_s();
	r = lk->poll ? rmdir(lk->path) : flock(fd, LOCK_UN);
	if (r != 0) {
		fprintf(stderr, "bench_handoff: holder release %s: %s\n",
			lk->path, strerror(errno));
		return -1;
	}
	if (read_byte(done_fd, "waiter") != DONE)
		return -1;
	return sh->t_return - t0;
}

/* One lock of a hand-off run, with its holder's descriptor and its waiter. */
struct ho_pair {
	struct ho_lock lk;
	struct ho_shared *sh;
	int fd;          /* the holder's descriptor (flock), or -1 */
	int go, done;    /* pipes to and from the waiter */
	pid_t waiter;
	double *lat;
};

/* Sets up P: the holder's descriptor and the waiter. Returns 0 or -1. */
static int pair_start(struct ho_pair *p, long n)
{
	int go[2], done[2];

	p->fd = -1;
	p->waiter = 0;
	p->lat = calloc((size_t) n, sizeof(*p->lat));
	p->sh = mmap(NULL, sizeof(*p->sh), PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (!p->lat || p->sh == MAP_FAILED || pipe2(go, O_CLOEXEC) != 0 ||
	    pipe2(done, O_CLOEXEC) != 0) {
		perror("bench_handoff: setup");
		return -1;
	}
	if (!p->lk.poll) {
		p->fd = open(p->lk.path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (p->fd < 0) {
			fprintf(stderr, "bench_handoff: open %s: %s\n",
				p->lk.path, strerror(errno));
			return -1;
		}
	}
	p->waiter = fork();
	if (p->waiter < 0) {
		perror("bench_handoff: fork");
		return -1;
	}
	if (p->waiter == 0) {
		close(go[1]);
		close(done[0]);
		if (p->fd >= 0)
			close(p->fd);
		waiter_main(&p->lk, p->sh, go[0], done[1]);
	}
	close(go[0]);
	close(done[1]);
	p->go = go[1];
	p->done = done[0];
	return 0;
}

/* Tells P's waiter to quit and reaps it (killed if it will not). Returns 0 or -1. */
static int pair_stop(struct ho_pair *p)
{
	int status, rc = -1;

	if (p->waiter <= 0)
		return -1;
	if (write_byte(p->go, QUIT) == 0) {
		close(p->go);
		if (waitpid(p->waiter, &status, 0) == p->waiter &&
		    WIFEXITED(status) && WEXITSTATUS(status) == 0)
			rc = 0;
	} else {
		kill_and_reap(p->waiter);
	}
	p->waiter = 0;
	return rc;
}

/*
 * N timed samples on each of the NP locks, interleaved sample by sample
 * (A B, then B A, ...), so that every lock sees the same moments of a noisy
 * machine.  Prints one line per sample with one column per lock.
 */
static int run_handoff(struct ho_pair *pairs, int np, long n)
{
	long warm = warmup_count(n);
	int rc = 0;

	for (int k = 0; k < np; k++)
		if (pair_start(&pairs[k], n) != 0) {
			rc = 1;
			break;
		}
	for (long i = -warm; rc == 0 && i < n; i++) {
		for (int j = 0; j < np; j++) {
			int k = (i & 1) ? np - 1 - j : j;
			struct ho_pair *p = &pairs[k];
			double t = holder_sample(&p->lk, p->fd, p->waiter, p->sh,
						 p->go, p->done);

			if (t < 0) {
				rc = 1;
				break;
			}
			if (i >= 0)
				p->lat[i] = t;
		}
	}
	for (int k = 0; k < np; k++) {
		if (pairs[k].waiter > 0 && pair_stop(&pairs[k]) != 0)
			rc = 1;
		if (pairs[k].fd >= 0)
			close(pairs[k].fd);
	}
	for (long i = 0; rc == 0 && i < n; i++)
		for (int k = 0; k < np; k++)
			printf("%.3f%c", pairs[k].lat[i] * 1e6, k == np - 1 ? '\n' : ' ');
	for (int k = 0; k < np; k++)
		free(pairs[k].lat);
	return rc;
}

/* ------------------------------------------------------------- herd --- */

/*
 * Shared by the herd agents (MAP_SHARED|MAP_ANONYMOUS).  order[] is written
 * under the lock being measured; inside and overlaps detect two holders.
 */
struct herd_shared {
	atomic_long next;       /* grants so far = index of the next grant */
	atomic_int inside;      /* agents inside the critical section */
	atomic_long overlaps;   /* grants that found someone inside */
	atomic_int failed;
	double end[MAX_AGENTS]; /* when each agent finished */
	int order[];            /* agent of each grant, in acquisition order */
};

/* Body of herd agent SLOT; never returns. */
static void herd_agent(struct herd_shared *sh, int slot, const char *file,
		       long rounds, int ready_fd, int gate_fd)
{
	volatile unsigned long work = 0;
	char c = 'r';
	int fd;

	if (child_setup() != 0)
		_exit(1);
	fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		fprintf(stderr, "bench_handoff: agent open %s: %s\n", file,
			strerror(errno));
		goto fail;
	}
	if (write(ready_fd, &c, 1) != 1 || read(gate_fd, &c, 1) < 0)
		goto fail;
	alarm(timeout_s);
	for (long r = 0; r < rounds; r++) {
		long seq;

		if (flock(fd, LOCK_EX) != 0) {
			fprintf(stderr,
				"bench_handoff: agent %d flock(LOCK_EX), round %ld: %s%s\n",
				slot, r, strerror(errno),
				errno == EINTR ? " (timeout)" : "");
			goto fail;
		}
		if (atomic_fetch_add(&sh->inside, 1) != 0)
			atomic_fetch_add(&sh->overlaps, 1);
		seq = atomic_fetch_add(&sh->next, 1);
		sh->order[seq] = slot;
		for (int i = 0; i < 100; i++) /* the tiny critical section */
			work += (unsigned long) i;
		atomic_fetch_sub(&sh->inside, 1);
		if (flock(fd, LOCK_UN) != 0) {
			fprintf(stderr, "bench_handoff: agent %d flock(LOCK_UN): %s\n",
				slot, strerror(errno));
			goto fail;
		}
	}
	alarm(0);
	sh->end[slot] = now_s();
	close(fd);
	_exit(0);
fail:
	atomic_store(&sh->failed, 1);
	_exit(1);
}

static int run_herd(const char *file, long agents, long rounds)
{
	size_t total = (size_t) (agents * rounds), size;
	struct herd_shared *sh;
	pid_t pids[MAX_AGENTS];
	long nready = 0, quarter, *first;
	int gate[2], ready[2], rc = 0, left;
	double start, last, deadline;
	char c;

	size = sizeof(*sh) + total * sizeof(sh->order[0]);
	sh = mmap(NULL, size, PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	first = calloc((size_t) agents, sizeof(*first));
	if (sh == MAP_FAILED || !first || pipe2(gate, O_CLOEXEC) != 0 ||
	    pipe2(ready, O_CLOEXEC) != 0) {
		perror("bench_handoff: setup");
		return 1;
	}
	for (long i = 0; i < agents; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			perror("bench_handoff: fork");
			for (long j = 0; j < i; j++)
				kill_and_reap(pids[j]);
			return 1;
		}
		if (pids[i] == 0) {
			close(gate[1]);
			close(ready[0]);
			herd_agent(sh, (int) i, file, rounds, ready[1], gate[0]);
		}
	}
	close(gate[0]);
	close(ready[1]);
	/* Open the gate once every agent has its descriptor. */
	while (nready < agents && read(ready[0], &c, 1) == 1)
		nready++;
	close(ready[0]);
	start = now_s();
	close(gate[1]);

	deadline = start + timeout_s + 5;
	for (left = (int) agents; left > 0;) {
		int status;
		pid_t p = waitpid(-1, &status, WNOHANG);

		if (p > 0) {
			for (long i = 0; i < agents; i++)
				if (pids[i] == p)
					pids[i] = 0;
			left--;
			if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
				rc = 1;
			continue;
		}
		if (p < 0 && errno != EINTR)
			break;
		if (now_s() > deadline) {
			fprintf(stderr,
				"bench_handoff: herd not done after %d s: %ld of %zu grants, %d agents left\n",
				timeout_s, atomic_load(&sh->next), total, left);
			for (long i = 0; i < agents; i++)
				if (pids[i] > 0)
					kill_and_reap(pids[i]);
			return 1;
		}
		sleep_us(2000);
	}
	if (rc || atomic_load(&sh->failed)) {
		fprintf(stderr, "bench_handoff: a herd agent failed\n");
		return 1;
	}
	if (atomic_load(&sh->overlaps) != 0 || (size_t) atomic_load(&sh->next) != total) {
		fprintf(stderr,
			"bench_handoff: mutual exclusion broken: %ld grants found another agent inside (%ld grants)\n",
			atomic_load(&sh->overlaps), atomic_load(&sh->next));
		return 1;
	}
	last = start;
	for (long i = 0; i < agents; i++)
		if (sh->end[i] > last)
			last = sh->end[i];
	quarter = (long) (total / 4);
	for (long i = 0; i < quarter; i++)
		first[sh->order[i]]++;
	printf("%.3f", (last - start) * 1e3);
	for (long i = 0; i < agents; i++)
		printf(" %ld", first[i]);
	printf("\n");
	free(first);
	return 0;
}

#define MAX_PAIRS 4

int main(int argc, char *argv[])
{
	const char *t = getenv("LOCKFS_BENCH_TIMEOUT");
	struct ho_pair pairs[MAX_PAIRS];

	memset(pairs, 0, sizeof(pairs));
	if (t)
		timeout_s = (int) parse_long(t, "LOCKFS_BENCH_TIMEOUT", 1, 3600);
	if (argc < 2)
		usage(argv[0]);
	if (strcmp(argv[1], "handoff") == 0 && argc >= 6 && argc % 2 == 0 &&
	    (argc - 4) / 2 <= MAX_PAIRS) {
		long n = parse_long(argv[2], "N", 1, MAX_SAMPLES);
		long settle = parse_long(argv[3], "SETTLE_US", 0, 1000000);
		int np = (argc - 4) / 2;

		for (int k = 0; k < np; k++) {
			char *sep = strchr(argv[4 + 2 * k], '=');

			pairs[k].lk.path = argv[4 + 2 * k];
			pairs[k].lk.waiter_path = sep ? sep + 1 : pairs[k].lk.path;
			if (sep)
				*sep = '\0';
			pairs[k].lk.parked = argv[5 + 2 * k];
			pairs[k].lk.settle_us = settle;
		}
		return run_handoff(pairs, np, n);
	}
	if (strcmp(argv[1], "poll") == 0 && argc == 5) {
		pairs[0].lk.path = argv[2];
		pairs[0].lk.poll = 1;
		pairs[0].lk.interval_us =
			1000 * parse_long(argv[4], "INTERVAL_MS", 1, 10000);
		return run_handoff(pairs, 1, parse_long(argv[3], "N", 1, MAX_SAMPLES));
	}
	if (strcmp(argv[1], "herd") == 0 && argc == 5) {
		long agents = parse_long(argv[3], "AGENTS", 4, MAX_AGENTS);

		return run_herd(argv[2], agents,
				parse_long(argv[4], "ROUNDS", 1, 100000));
	}
	usage(argv[0]);
	return 2;
}
