/*
 * bench_pairs: the C client of the lockfs benchmark (tools/bench/bench.sh).
 *
 *   bench_pairs pairs DIRPATH N
 *       N times mkdir(DIRPATH/bench-<pid>-x) + rmdir(same); prints the mean
 *       µs per pair on stdout.
 *   bench_pairs each DIRPATH N
 *       as pairs, without the warm-up (the caller warms up with a run of
 *       its own, outside its CPU accounting), printing every pair's µs on
 *       its own line: for the medians and percentiles of
 *       bench_etcd_scale.py.
 *   bench_pairs flock FILE N
 *       N times flock(LOCK_EX) + flock(LOCK_UN) on one open descriptor of
 *       FILE; prints the mean µs per pair on stdout.
 *   bench_pairs lookups DIRPATH N
 *       N times stat(DIRPATH/bench-<pid>-none), a name nobody holds
 *       (ENOENT expected): one FUSE round trip each, a LOOKUP the daemon
 *       answers from what it knows; prints the mean µs per stat.  The
 *       least any FUSE request costs, in the same units as a pair.
 *   bench_pairs rate DIRPATH CLIENTS SECONDS
 *       CLIENTS forked processes, each looping mkdir+rmdir on its own name
 *       (DIRPATH/bench-<pid>-r) for SECONDS; prints the aggregate pairs/s on
 *       stdout.
 *
 *
 * Decomposition modes (no FUSE: the syscalls the lockfs daemon makes per
 * pair, replayed directly, as traced with strace on the issue-2 daemon):
 *   bench_pairs backing DIR N   the backing-directory protocol: build
 *       DIR/.bench-new/owner.json (~420 bytes), renameat2 NOREPLACE to
 *       DIR/bench-<pid>-x.lock, then read the record back (openat2, fstat,
 *       pread), rename it aside and remove it; plus the six fstatat the
 *       daemon's lookups, mkdir and rmdir make on NAME.lock.
 *   bench_pairs proc N          the /proc reads for one pair, on the
 *       caller itself: stat twice, exe (readlink), environ, cmdline.
 *   bench_pairs log DIR N       two O_APPEND writes of an 87-byte line to
 *       DIR/bench.log (the acquired and released audit lines).
 *
 * Each pair is one acquire + one release.  A short untimed warm-up precedes
 * the timed loop (first-use costs: daemon threads, dentry allocation).  Any
 * failing call aborts the run with a message on stderr and exit status 1, so
 * a benchmark never reports the speed of an error path.
 *
 * Times come from clock_gettime(CLOCK_MONOTONIC).
 */

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CLIENTS 256

static void usage(const char *prog)
{
	fprintf(stderr,
		"usage: %s pairs DIRPATH N\n"
		"       %s each DIRPATH N\n"
		"       %s flock FILE N\n"
		"       %s lookups DIRPATH N\n"
		"       %s rate DIRPATH CLIENTS SECONDS\n"
		"       %s backing DIR N | proc N | log DIR N\n",
		prog, prog, prog, prog, prog, prog);
	exit(2);
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* Returns the positive integer in S, or exits with a usage error. */
static long parse_count(const char *s, const char *what, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno || *end || v <= 0 || v > max) {
		fprintf(stderr, "bench_pairs: bad %s '%s' (1..%ld)\n", what, s,
			max);
		exit(2);
	}
	return v;
}

/* Returns the duration in S (0 < s <= 3600), or exits with a usage error. */
static double parse_seconds(const char *s)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || *end || !(v > 0.0 && v <= 3600.0)) {
		fprintf(stderr, "bench_pairs: bad SECONDS '%s' (0..3600)\n", s);
		exit(2);
	}
	return v;
}

/* One acquire+release of PATH. Returns 0, or -1 after a message on stderr. */
static int one_pair(const char *path)
{
	if (mkdir(path, 0755) != 0) {
		fprintf(stderr, "bench_pairs: mkdir %s: %s\n", path,
			strerror(errno));
		return -1;
	}
	if (rmdir(path) != 0) {
		fprintf(stderr, "bench_pairs: rmdir %s: %s\n", path,
			strerror(errno));
		return -1;
	}
	return 0;
}

/* Returns N/10 capped to 1..200: enough to start the daemon's threads. */
static long warmup_count(long n)
{
	long w = n / 10;

	if (w < 1)
		w = 1;
	if (w > 200)
		w = 200;
	return w;
}

static int run_pairs(const char *dir, long n)
{
	char path[PATH_MAX];
	double t0, t1;

	if (snprintf(path, sizeof(path), "%s/bench-%d-x", dir, (int) getpid())
	    >= (int) sizeof(path)) {
		fprintf(stderr, "bench_pairs: path too long\n");
		return 1;
	}
	for (long i = warmup_count(n); i > 0; i--)
		if (one_pair(path) != 0)
			return 1;
	t0 = now_s();
	for (long i = 0; i < n; i++)
		if (one_pair(path) != 0)
			return 1;
	t1 = now_s();
	printf("%.3f\n", (t1 - t0) * 1e6 / (double) n);
	return 0;
}

/* N pairs, no warm-up; each pair's µs on a line of its own, printed once
 * the loop is done so that the writes time nothing. */
static int run_each(const char *dir, long n)
{
	char path[PATH_MAX];
	double *took = calloc((size_t) n, sizeof(*took));

	if (!took) {
		fprintf(stderr, "bench_pairs: out of memory\n");
		return 1;
	}
	if (snprintf(path, sizeof(path), "%s/bench-%d-x", dir, (int) getpid())
	    >= (int) sizeof(path)) {
		fprintf(stderr, "bench_pairs: path too long\n");
		free(took);
		return 1;
	}
	for (long i = 0; i < n; i++) {
		double t0 = now_s();

		if (one_pair(path) != 0) {
			free(took);
			return 1;
		}
		took[i] = (now_s() - t0) * 1e6;
	}
	for (long i = 0; i < n; i++)
		printf("%.1f\n", took[i]);
	free(took);
	return 0;
}

/* One lookup of PATH, a free name: 0 when it failed with ENOENT, else -1
 * after a message on stderr. */
static int one_lookup(const char *path)
{
	struct stat st;

	if (stat(path, &st) == 0) {
		fprintf(stderr, "bench_pairs: stat %s: exists\n", path);
		return -1;
	}
	if (errno != ENOENT) {
		fprintf(stderr, "bench_pairs: stat %s: %s\n", path, strerror(errno));
		return -1;
	}
	return 0;
}

static int run_lookups(const char *dir, long n)
{
	char path[PATH_MAX];
	struct stat st;
	double t0, t1;

	/* Else the parent's ENOENT would pass for the name's. */
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) {
		fprintf(stderr, "bench_pairs: %s: not a directory\n", dir);
		return 1;
	}
	if (snprintf(path, sizeof(path), "%s/bench-%d-none", dir, (int) getpid())
	    >= (int) sizeof(path)) {
		fprintf(stderr, "bench_pairs: path too long\n");
		return 1;
	}
	for (long i = warmup_count(n); i > 0; i--)
		if (one_lookup(path) != 0)
			return 1;
	t0 = now_s();
	for (long i = 0; i < n; i++)
		if (one_lookup(path) != 0)
			return 1;
	t1 = now_s();
	printf("%.3f\n", (t1 - t0) * 1e6 / (double) n);
	return 0;
}

/* One flock lock+unlock on FD. Returns 0, or -1 after a message. */
static int one_flock(int fd)
{
	if (flock(fd, LOCK_EX) != 0 || flock(fd, LOCK_UN) != 0) {
		fprintf(stderr, "bench_pairs: flock: %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

static int run_flock(const char *file, long n)
{
	double t0, t1;
	int fd;

	fd = open(file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0) {
		fprintf(stderr, "bench_pairs: open %s: %s\n", file,
			strerror(errno));
		return 1;
	}
	for (long i = warmup_count(n); i > 0; i--)
		if (one_flock(fd) != 0)
			goto fail;
	t0 = now_s();
	for (long i = 0; i < n; i++)
		if (one_flock(fd) != 0)
			goto fail;
	t1 = now_s();
	close(fd);
	printf("%.3f\n", (t1 - t0) * 1e6 / (double) n);
	return 0;
fail:
	close(fd);
	return 1;
}

/*
 * Shared between the parent and the rate clients (MAP_SHARED|MAP_ANONYMOUS).
 * start is written by the parent before it opens the gate; each client
 * writes only its own slot of count/end/failed.
 */
struct rate_shared {
	double start;
	double deadline;
	long count[MAX_CLIENTS];
	double end[MAX_CLIENTS];
	int failed[MAX_CLIENTS];
};

/* Body of rate client SLOT; never returns. */
static void rate_client(struct rate_shared *sh, int slot, const char *dir,
			int ready_fd, int gate_fd)
{
	char path[PATH_MAX];
	char c = 'r';
	long count = 0;

	snprintf(path, sizeof(path), "%s/bench-%d-r", dir, (int) getpid());
	for (int i = 0; i < 20; i++)
		if (one_pair(path) != 0)
			goto fail;
	/* Report ready, then wait at the gate (opened by closing its end). */
	if (write(ready_fd, &c, 1) != 1 || read(gate_fd, &c, 1) < 0)
		goto fail;
	while (now_s() < sh->deadline) {
		if (one_pair(path) != 0)
			goto fail;
		count++;
	}
	sh->count[slot] = count;
	sh->end[slot] = now_s();
	_exit(0);
fail:
	sh->failed[slot] = 1;
	_exit(1);
}

static int run_rate(const char *dir, long clients, double seconds)
{
	struct rate_shared *sh;
	pid_t pids[MAX_CLIENTS];
	int gate[2], ready[2];
	long nready = 0;
	char c;
	int status, rc = 0;
	long total = 0;
	double last_end;

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE,
		  MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("bench_pairs: mmap");
		return 1;
	}
	if (pipe(gate) != 0 || pipe(ready) != 0) {
		perror("bench_pairs: pipe");
		return 1;
	}
	for (long i = 0; i < clients; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			perror("bench_pairs: fork");
			for (long j = 0; j < i; j++)
				kill(pids[j], SIGTERM);
			clients = i;
			rc = 1;
			break;
		}
		if (pids[i] == 0) {
			close(gate[1]);
			close(ready[0]);
			rate_client(sh, (int) i, dir, ready[1], gate[0]);
		}
	}
	close(gate[0]);
	close(ready[1]);
	/* Start the clock once every client has finished its warm-up. */
	while (nready < clients && read(ready[0], &c, 1) == 1)
		nready++;
	close(ready[0]);
	sh->start = now_s();
	sh->deadline = sh->start + seconds;
	close(gate[1]); /* opens the gate: every read() returns 0 */

	for (long i = 0; i < clients; i++) {
		if (waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) ||
		    WEXITSTATUS(status) != 0)
			rc = 1;
	}
	if (rc)
		return 1;

	last_end = sh->start;
	for (long i = 0; i < clients; i++) {
		total += sh->count[i];
		if (sh->end[i] > last_end)
			last_end = sh->end[i];
	}
	printf("%.1f\n", (double) total / (last_end - sh->start));
	return 0;
}

/* ---- decomposition: the daemon's per-pair syscalls without FUSE ---- */

#define CHECK(expr)                                                        \
	do {                                                               \
		if ((expr) < 0) {                                          \
			fprintf(stderr, "bench_pairs: %s: %s\n", #expr,    \
				strerror(errno));                          \
			return -1;                                         \
		}                                                          \
	} while (0)

static char record[420];

/* One acquire+release of the backing protocol in DFD. Returns 0 or -1. */
static int one_backing(int dfd, const char *lock)
{
	struct open_how how = {
		.flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC,
		.resolve = RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH,
	};
	char path[PATH_MAX], buf[sizeof(record) + 1];
	unsigned char token[16];
	struct stat st;
	int fd;

	/* LOOKUP (negative) */
	if (fstatat(dfd, lock, &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT) {
		fprintf(stderr, "bench_pairs: %s exists\n", lock);
		return -1;
	}
	/* MKDIR */
	CHECK(getrandom(token, sizeof(token), 0));
	CHECK(mkdirat(dfd, ".bench-new", 0755));
	CHECK(fd = openat(dfd, ".bench-new/owner.json",
			  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
			  0600));
	CHECK(write(fd, record, sizeof(record)));
	CHECK(close(fd));
	CHECK(syscall(SYS_renameat2, dfd, ".bench-new", dfd, lock,
		      RENAME_NOREPLACE));
	CHECK(fstatat(dfd, lock, &st, AT_SYMLINK_NOFOLLOW));
	/* LOOKUP (positive, before rmdir) */
	CHECK(fstatat(dfd, lock, &st, AT_SYMLINK_NOFOLLOW));
	/* RMDIR */
	CHECK(fstatat(dfd, lock, &st, AT_SYMLINK_NOFOLLOW));
	snprintf(path, sizeof(path), "%s/owner.json", lock);
	CHECK(fd = (int) syscall(SYS_openat2, dfd, path, &how, sizeof(how)));
	CHECK(fstat(fd, &st));
	CHECK(pread(fd, buf, sizeof(buf), 0));
	CHECK(close(fd));
	CHECK(fstatat(dfd, lock, &st, AT_SYMLINK_NOFOLLOW));
	CHECK(syscall(SYS_renameat2, dfd, lock, dfd, ".bench-old",
		      RENAME_NOREPLACE));
	CHECK(unlinkat(dfd, ".bench-old/owner.json", 0));
	CHECK(unlinkat(dfd, ".bench-old", AT_REMOVEDIR));
	return 0;
}

/* Reads PATH whole (one read, like the daemon). Returns 0 or -1. */
static int read_small(const char *path, size_t max)
{
	char buf[8192];
	int fd;

	CHECK(fd = open(path, O_RDONLY | O_NOCTTY | O_CLOEXEC));
	CHECK(read(fd, buf, max < sizeof(buf) ? max : sizeof(buf)));
	CHECK(close(fd));
	return 0;
}

/* The /proc reads of one pair, on ourselves. Returns 0 or -1. */
static int one_proc(pid_t pid)
{
	char path[64], exe[PATH_MAX];

	/* mkdir: stat, exe, environ, cmdline */
	snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
	if (read_small(path, 2047) < 0)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/exe", (int) pid);
	CHECK(readlink(path, exe, sizeof(exe) - 1));
	snprintf(path, sizeof(path), "/proc/%d/environ", (int) pid);
	if (read_small(path, 4096) < 0)
		return -1;
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int) pid);
	if (read_small(path, 4096) < 0)
		return -1;
	/* rmdir: stat */
	snprintf(path, sizeof(path), "/proc/%d/stat", (int) pid);
	return read_small(path, 2047);
}

/* Mode backing/proc/log: N pairs of decomposition step WHAT. */
static int run_part(const char *what, const char *dir, long n)
{
	static const char line[] = "2026-01-01T00:00:00.000Z bench_pairs[12345] "
				   "bench-12345-x fence=1 pid=12345 acquired\n";
	char lock[64], path[PATH_MAX];
	int dfd = -1, logfd = -1, rc = 0;
	pid_t pid = getpid();
	double t0 = 0, t1;

	memset(record, 'r', sizeof(record));
	snprintf(lock, sizeof(lock), "bench-%d-x.lock", (int) pid);
	if (dir) {
		dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd < 0) {
			fprintf(stderr, "bench_pairs: %s: %s\n", dir,
				strerror(errno));
			return 1;
		}
		snprintf(path, sizeof(path), "%s/bench.log", dir);
		logfd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC,
			     0600);
		if (logfd < 0) {
			fprintf(stderr, "bench_pairs: %s: %s\n", path,
				strerror(errno));
			close(dfd);
			return 1;
		}
	}
	for (long i = -warmup_count(n); i < n; i++) {
		if (i == 0)
			t0 = now_s();
		if (strcmp(what, "backing") == 0)
			rc = one_backing(dfd, lock);
		else if (strcmp(what, "proc") == 0)
			rc = one_proc(pid);
		else
			rc = (write(logfd, line, sizeof(line) - 1) < 0 ||
			      write(logfd, line, sizeof(line) - 1) < 0) ? -1 : 0;
		if (rc < 0)
			break;
	}
	t1 = now_s();
	if (logfd >= 0) {
		close(logfd);
		unlinkat(dfd, "bench.log", 0);
	}
	if (dfd >= 0)
		close(dfd);
	if (rc < 0)
		return 1;
	printf("%.3f\n", (t1 - t0) * 1e6 / (double) n);
	return 0;
}

int main(int argc, char *argv[])
{
	if (argc < 2)
		usage(argv[0]);
	if (strcmp(argv[1], "pairs") == 0 && argc == 4)
		return run_pairs(argv[2], parse_count(argv[3], "N", LONG_MAX));
	if (strcmp(argv[1], "each") == 0 && argc == 4)
		return run_each(argv[2], parse_count(argv[3], "N", 10000000));
	if (strcmp(argv[1], "flock") == 0 && argc == 4)
		return run_flock(argv[2], parse_count(argv[3], "N", LONG_MAX));
	if (strcmp(argv[1], "lookups") == 0 && argc == 4)
		return run_lookups(argv[2], parse_count(argv[3], "N", LONG_MAX));
	if (strcmp(argv[1], "rate") == 0 && argc == 5)
		return run_rate(argv[2],
				parse_count(argv[3], "CLIENTS", MAX_CLIENTS),
				parse_seconds(argv[4]));
	if (strcmp(argv[1], "backing") == 0 && argc == 4)
		return run_part("backing", argv[2],
				parse_count(argv[3], "N", LONG_MAX));
	if (strcmp(argv[1], "proc") == 0 && argc == 3)
		return run_part("proc", NULL, parse_count(argv[2], "N", LONG_MAX));
	if (strcmp(argv[1], "log") == 0 && argc == 4)
		return run_part("log", argv[2], parse_count(argv[3], "N", LONG_MAX));
	usage(argv[0]);
	return 2;
}
