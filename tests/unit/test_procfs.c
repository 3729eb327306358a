/*
 * Unit tests for core/proc/procfs.c and the real /proc: the one
 * /proc/PID/stat parser, the readers on real processes (threads, helpers,
 * pidfds, environments, command lines, namespaces), container ids from
 * cgroup paths (issue 9 §4), and a source's optional functions falling back
 * to /proc.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "lockfs/holder.h"

#include "fake_procs.h"
#include "holder_test_util.h"

/* ---- the real /proc -------------------------------------------------- */

/* Field 22 of /proc/PID/stat, parsed here independently of procfs.c. */
static unsigned long long real_start_time(pid_t pid)
{
	char path[64], buf[2048];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	FILE *f = fopen(path, "re");
	assert_non_null(f);
	size_t n = fread(buf, 1, sizeof(buf) - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	assert_non_null(p);
	p++;
	for (int field = 3; field < 22; field++) {
		p = strchr(p + 1, ' ');
		assert_non_null(p);
	}
	return strtoull(p + 1, NULL, 10);
}

/* ---- the one /proc/PID/stat parser ------------------------------------- */

/* A stat line of 52 fields: pid, comm, state, then 3..52 as "F<n>" except
 * the numbers asked for.  EXIT_SIGNAL is field 38. */
static void stat_line(char *buf, size_t size, const char *comm, char state,
		      const char *exit_signal)
{
	int n = snprintf(buf, size, "4242 (%s) %c 17 4242 99 0 -1", comm, state);
	for (int field = 9; field <= 52; field++)
		n += snprintf(buf + n, size - (size_t)n, " %s",
			      field == 20 ? "3" : field == 22 ? "123456" :
			      field == 38 ? exit_signal : "0");
	snprintf(buf + n, size - (size_t)n, "\n");
}

static void test_stat_parse_reads_the_fields_after_the_last_paren(void **state)
{
	char line[512];
	struct lockfs_proc_stat st;
	(void)state;

	/* A comm may hold spaces and parentheses, even ") Z 1 2 ". */
	stat_line(line, sizeof(line), "a) Z 1 2 (b", 'S', "17");
	assert_int_equal(lockfs_proc_stat_parse(line, &st), 0);
	assert_string_equal(st.comm, "a) Z 1 2 (b");
	assert_int_equal(st.state, 'S');
	assert_int_equal(st.ppid, 17);
	assert_int_equal(st.sid, 99);
	assert_int_equal(st.threads, 3);
	assert_true(st.start_time == 123456);
	assert_true(st.leader);

	/* Exit signal -1: a thread, not a thread-group leader. */
	stat_line(line, sizeof(line), "worker", 'Z', "-1");
	assert_int_equal(lockfs_proc_stat_parse(line, &st), 0);
	assert_int_equal(st.state, 'Z');
	assert_false(st.leader);
}

static void test_stat_parse_refuses_what_is_not_a_stat_line(void **state)
{
	char line[512];
	struct lockfs_proc_stat st;
	(void)state;

	assert_int_equal(lockfs_proc_stat_parse("", &st), -EIO);
	assert_int_equal(lockfs_proc_stat_parse("4242 (no close paren S 1", &st), -EIO);
	assert_int_equal(lockfs_proc_stat_parse("4242 (x)", &st), -EIO);
	/* Cut short before field 38. */
	stat_line(line, sizeof(line), "sh", 'S', "17");
	*strstr(line, " 123456 ") = '\0';
	assert_int_equal(lockfs_proc_stat_parse(line, &st), -EIO);
	/* Field 4 not a number. */
	assert_int_equal(lockfs_proc_stat_parse("4242 (sh) S x 1 1 0 -1", &st), -EIO);
}

static void *park(void *arg)
{
	int *fd = arg;
	char c;
	ssize_t n = read(*fd, &c, 1); /* until the test lets it go */

	(void)n;
	return NULL;
}

static void test_procfs_stat_reads_a_process_and_its_thread(void **state)
{
	struct lockfs_proc_stat st;
	int pipefd[2];
	pthread_t th;
	pid_t tid = 0;
	char path[64];
	(void)state;

	assert_int_equal(lockfs_procfs_stat(getpid(), 0, &st), 0);
	assert_true(st.leader);
	assert_int_equal(st.ppid, getppid());
	assert_true(st.start_time == real_start_time(getpid()));
	assert_true(st.threads >= 1);

	/* A second thread: its own stat says it is no leader. */
	assert_int_equal(pipe(pipefd), 0);
	assert_int_equal(pthread_create(&th, NULL, park, &pipefd[0]), 0);
	/* It is in /proc/PID/task once pthread_create() has returned. */
	snprintf(path, sizeof(path), "/proc/%d/task", (int)getpid());
	DIR *d = opendir(path);
	struct dirent *de;
	assert_non_null(d);
	while ((de = readdir(d)))
		if (atoi(de->d_name) > 0 && atoi(de->d_name) != getpid())
			tid = atoi(de->d_name);
	closedir(d);
	assert_true(tid > 0);
	assert_int_equal(lockfs_procfs_stat(getpid(), tid, &st), 0);
	assert_false(st.leader);
	assert_int_equal(lockfs_procfs_stat(tid, 0, &st), 0); /* /proc/TID/stat too */
	assert_false(st.leader);
	assert_int_equal(write(pipefd[1], "x", 1), 1);
	assert_int_equal(pthread_join(th, NULL), 0);
	close(pipefd[0]);
	close(pipefd[1]);

	assert_int_equal(lockfs_procfs_stat(0, 0, &st), -ENOENT);
	assert_int_equal(lockfs_procfs_stat(INT_MAX, 0, &st), -ENOENT);
}

/*
 * Start PATH with ARGV and ENVP and return its pid once the exec happened
 * (a close-on-exec pipe closes at exec; a failed exec writes errno).
 */
static pid_t spawn(const char *path, const char *const argv[],
		   const char *const envp[])
{
	int fds[2];
	assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(fds[0]);
		/* execve() takes char *const[] for history's sake; it writes nothing */
		execve(path, (char *const *)argv, (char *const *)envp);
		int e = errno;
		(void)!write(fds[1], &e, sizeof(e));
		_exit(127);
	}
	close(fds[1]);
	int e = 0;
	ssize_t n = read(fds[0], &e, sizeof(e));
	close(fds[0]);
	assert_int_equal(n, 0);
	return pid;
}

static void reap(pid_t pid)
{
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
}

/* Copy the file at SRC to DST, executable. */
static void copy_exe(const char *src, const char *dst)
{
	char buf[65536];
	int in = open(src, O_RDONLY | O_CLOEXEC);
	int out = open(dst, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
	assert_true(in >= 0 && out >= 0);
	ssize_t n;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		assert_int_equal(write(out, buf, (size_t)n), n);
	assert_int_equal(n, 0);
	close(in);
	close(out);
}

static void test_real_read_self(void **state)
{
	struct lockfs_proc p;
	assert_int_equal(lockfs_procfs_source.read_tid(lockfs_procfs_source.ctx, getpid(), LOCKFS_PROC_EXE | LOCKFS_PROC_IDS, &p), 0);
	assert_int_equal(p.pid, getpid());
	assert_int_equal(p.ppid, getppid());
	assert_int_equal(p.sid, getsid(0));
	assert_int_equal(p.uid, geteuid());
	assert_int_equal(p.gid, getegid());
	assert_int_equal(p.start_time, real_start_time(getpid()));
	char comm[64] = "";
	FILE *f = fopen("/proc/self/comm", "re");
	assert_non_null(f);
	assert_non_null(fgets(comm, sizeof(comm), f));
	fclose(f);
	comm[strcspn(comm, "\n")] = '\0';
	assert_string_equal(p.comm, comm);

	char exe[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	assert_true(n > 0);
	exe[n] = '\0';
	assert_string_equal(p.exe, strrchr(exe, '/') + 1);
}

static void test_real_comm_with_parens_and_spaces(void **state)
{
	/* stat fields are counted after the LAST ')' of the comm */
	int fds[2];
	assert_int_equal(pipe2(fds, O_CLOEXEC), 0);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		prctl(PR_SET_NAME, "x) (y z) 1 2");
		(void)!write(fds[1], "", 1);
		pause();
		_exit(0);
	}
	char c;
	assert_int_equal(read(fds[0], &c, 1), 1);
	close(fds[0]);
	close(fds[1]);
	struct lockfs_proc p;
	assert_int_equal(lockfs_procfs_source.read_tid(NULL, child, LOCKFS_PROC_EXE | LOCKFS_PROC_IDS, &p), 0);
	assert_string_equal(p.comm, "x) (y z) 1 2");
	assert_int_equal(p.ppid, getpid());
	assert_int_equal(p.sid, getsid(0));
	assert_int_equal(p.start_time, real_start_time(child));
	reap(child);
}

static void test_real_resolve_self_with_no_helpers(void **state)
{
	struct lockfs_helpers none;
	struct lockfs_proc p;
	assert_int_equal(lockfs_helpers_parse(&none, ""), 0);
	assert_int_equal(lockfs_holder_resolve(&lockfs_procfs_source, getpid(), geteuid(), &none, 0, &p), 0);
	assert_int_equal(p.pid, getpid());
	assert_int_equal(p.start_time, real_start_time(getpid()));
	lockfs_helpers_free(&none);
}

struct thread_arg {
	pid_t tid;
	int rc;
	pid_t pid;
	unsigned long long start;
};

static void *thread_main(void *a)
{
	struct thread_arg *t = a;
	struct lockfs_helpers none;
	struct lockfs_proc p;
	assert_int_equal(lockfs_helpers_parse(&none, ""), 0);
	t->tid = gettid();
	t->rc = lockfs_holder_resolve(&lockfs_procfs_source, t->tid, geteuid(), &none, 0, &p);
	lockfs_helpers_free(&none);
	t->pid = p.pid;
	t->start = p.start_time;
	return NULL;
}

static void test_real_thread_resolves_to_process_start_time(void **state)
{
	/* The thread's own stat carries its own start time; the record
	 * must carry the process's. */
	usleep(20000); /* let the thread start in a later tick than us */
	struct thread_arg t = { 0 };
	pthread_t th;
	assert_int_equal(pthread_create(&th, NULL, thread_main, &t), 0);
	assert_int_equal(pthread_join(th, NULL), 0);
	assert_int_not_equal(t.tid, getpid());
	assert_int_equal(t.rc, 0);
	assert_int_equal(t.pid, getpid());
	assert_int_equal(t.start, real_start_time(getpid()));
}

static void test_real_resolve_skips_helper_child(void **state)
{
	struct lockfs_helpers h;
	struct lockfs_proc p;
	const char *argv[] = { "/bin/sleep", "5", NULL };
	const char *envp[] = { NULL };
	pid_t child = spawn("/bin/sleep", argv, envp);
	assert_int_equal(lockfs_helpers_parse(&h, "sleep"), 0);
	assert_int_equal(lockfs_holder_resolve(&lockfs_procfs_source, child, geteuid(), &h, 0, &p), 0);
	assert_int_equal(p.pid, getpid());
	assert_false(p.at_uid_boundary);
	/* negative control: with no helpers the child is the holder */
	struct lockfs_helpers none;
	assert_int_equal(lockfs_helpers_parse(&none, ""), 0);
	assert_int_equal(lockfs_holder_resolve(&lockfs_procfs_source, child, geteuid(), &none, 0, &p), 0);
	assert_int_equal(p.pid, child);
	assert_string_equal(p.exe, "sleep");
	lockfs_helpers_free(&none);
	lockfs_helpers_free(&h);
	reap(child);
}

static void test_real_resolve_opens_a_live_pidfd(void **state)
{
	struct lockfs_helpers none = { 0 };
	struct lockfs_proc p;
	struct pollfd pfd = { .events = POLLIN };

	assert_int_equal(lockfs_helpers_parse(&none, ""), 0);
	assert_int_equal(lockfs_holder_resolve(&lockfs_procfs_source, getpid(), geteuid(), &none,
					       LOCKFS_PROC_PIDFD, &p), 0);
	assert_true(p.has_pidfd);
	pfd.fd = p.pidfd;
	assert_int_equal(poll(&pfd, 1, 0), 0); /* we are alive */
	lockfs_proc_put(&p);
	assert_false(p.has_pidfd);
	lockfs_helpers_free(&none);
}

static void test_real_forked_child_may_release_our_lock(void **state)
{
	pid_t me = getpid();
	unsigned long long start = real_start_time(me);
	pid_t child = fork();
	assert_true(child >= 0);
	if (child == 0) {
		int rc = lockfs_holder_may_release(&lockfs_procfs_source, gettid(), me, start, false);
		int bad = lockfs_holder_may_release(&lockfs_procfs_source, gettid(), me, start + 1, false);
		_exit(rc == 0 && bad == -EPERM ? 0 : 1);
	}
	int status;
	assert_int_equal(waitpid(child, &status, 0), child);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_real_parent_may_not_release_childs_lock(void **state)
{
	const char *argv[] = { "/bin/sleep", "5", NULL };
	const char *envp[] = { NULL };
	pid_t child = spawn("/bin/sleep", argv, envp);
	struct lockfs_proc c;
	assert_int_equal(lockfs_procfs_source.read_tid(NULL, child, LOCKFS_PROC_EXE | LOCKFS_PROC_IDS, &c), 0);
	assert_int_equal(lockfs_holder_may_release(&lockfs_procfs_source, getpid(),
						   c.pid, c.start_time, false), -EPERM);
	assert_int_equal(lockfs_holder_may_release(&lockfs_procfs_source, child,
						   c.pid, c.start_time, false), 0);
	reap(child);
}

static void test_real_vanished_caller_is_esrch(void **state)
{
	struct lockfs_proc p;
	assert_int_equal(lockfs_holder_resolve(&lockfs_procfs_source, INT_MAX, 0, NULL, 0, &p), -ESRCH);
	assert_int_equal(lockfs_holder_may_release(&lockfs_procfs_source, INT_MAX, 500, 1, false), -ESRCH);
}

static void test_real_getenv_of_execd_child(void **state)
{
	const char *argv[] = { "/bin/sleep", "5", NULL };
	const char *envp[] = { "LOCKFS_SLU=no", "A=1", "LOCKFS_SLUG=abc", "EMPTY=", NULL };
	pid_t child = spawn("/bin/sleep", argv, envp);
	char buf[16];
	assert_int_equal(lockfs_procfs_getenv(child, "LOCKFS_SLUG", buf, sizeof(buf)), 3);
	assert_string_equal(buf, "abc");
	assert_int_equal(lockfs_procfs_getenv(child, "A", buf, sizeof(buf)), 1);
	assert_string_equal(buf, "1");
	assert_int_equal(lockfs_procfs_getenv(child, "EMPTY", buf, sizeof(buf)), 0);
	assert_string_equal(buf, "");
	assert_int_equal(lockfs_procfs_getenv(child, "LOCKFS", buf, sizeof(buf)), -ENOENT);
	assert_int_equal(lockfs_procfs_getenv(child, "PATH", buf, sizeof(buf)), -ENOENT);
	assert_int_equal(lockfs_procfs_getenv(child, "LOCKFS_SLUG", buf, 3), -ENAMETOOLONG);
	assert_int_equal(lockfs_procfs_getenv(child, "LOCKFS_SLUG", buf, 4), 3);
	assert_int_equal(lockfs_procfs_getenv(child, "A=1", buf, sizeof(buf)), -EINVAL);
	reap(child);
	assert_int_equal(lockfs_procfs_getenv(child, "A", buf, sizeof(buf)), -ENOENT);
}

static void test_real_cmdline_of_child(void **state)
{
	const char *argv[] = { "/bin/sleep", "5", NULL };
	const char *envp[] = { NULL };
	pid_t child = spawn("/bin/sleep", argv, envp);
	char **a;
	assert_int_equal(lockfs_procfs_cmdline(child, 4096, &a), 0);
	assert_string_equal(a[0], "/bin/sleep");
	assert_string_equal(a[1], "5");
	assert_null(a[2]);
	lockfs_argv_free(a);
	/* cut short: the unterminated last piece is kept */
	assert_int_equal(lockfs_procfs_cmdline(child, 6, &a), 0);
	assert_string_equal(a[0], "/bin/s");
	assert_null(a[1]);
	lockfs_argv_free(a);
	/* exactly the first element with its NUL */
	assert_int_equal(lockfs_procfs_cmdline(child, 11, &a), 0);
	assert_string_equal(a[0], "/bin/sleep");
	assert_null(a[1]);
	lockfs_argv_free(a);
	assert_int_equal(lockfs_procfs_cmdline(child, 0, &a), 0);
	assert_null(a[0]);
	lockfs_argv_free(a);
	reap(child);
	assert_int_equal(lockfs_procfs_cmdline(INT_MAX, 4096, &a), -ENOENT);
}

static void test_real_exe_deleted_and_busybox_applet(void **state)
{
	char dir[] = "/tmp/lockfs-test-holder-XXXXXX";
	char path[PATH_MAX];
	struct lockfs_proc p;
	assert_non_null(mkdtemp(dir));

	/* a deleted executable still reports its name, without " (deleted)" */
	snprintf(path, sizeof(path), "%s/zzsleep", dir);
	copy_exe("/bin/sleep", path);
	const char *argv1[] = { path, "5", NULL };
	const char *envp[] = { NULL };
	pid_t child = spawn(path, argv1, envp);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(lockfs_procfs_source.read_tid(NULL, child, LOCKFS_PROC_EXE | LOCKFS_PROC_IDS, &p), 0);
	assert_string_equal(p.exe, "zzsleep");
	reap(child);

	/* an executable named busybox is known by its applet, argv[0] */
	snprintf(path, sizeof(path), "%s/busybox", dir);
	copy_exe("/bin/sleep", path);
	const char *argv2[] = { "/some/where/snooze", "5", NULL };
	child = spawn(path, argv2, envp);
	assert_int_equal(lockfs_procfs_source.read_tid(NULL, child, LOCKFS_PROC_EXE | LOCKFS_PROC_IDS, &p), 0);
	assert_string_equal(p.exe, "snooze");
	reap(child);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(rmdir(dir), 0);
}

static void test_real_boot_id(void **state)
{
	char id[40];
	assert_int_equal(lockfs_procfs_boot_id(id), 0);
	assert_int_equal(strlen(id), 36);
	assert_int_equal(id[8], '-');
}

/* ---- container ids from cgroup paths (issue 9 §4) --------------------- */

#define ID64 "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define ID64B "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"

static const char *container_of(const char *text)
{
	static char out[LOCKFS_CONTAINER_MAX];
	int rc = lockfs_container_of_cgroup(text, out, sizeof(out));

	assert_int_equal(rc, out[0] != '\0');
	return out;
}

static void test_container_ids_of_the_common_runtimes(void **state)
{
	/* podman, systemd cgroup manager; rootless; cgroupfs manager */
	assert_string_equal(container_of("0::/machine.slice/libpod-" ID64 ".scope\n"), ID64);
	assert_string_equal(container_of("0::/user.slice/user-1000.slice/user@1000.service/"
					 "user.slice/libpod-" ID64 ".scope/container\n"), ID64);
	assert_string_equal(container_of("4:memory:/libpod_parent/libpod-" ID64 "\n"), ID64);
	/* podman's conmon names its container too */
	assert_string_equal(container_of("0::/machine.slice/libpod-conmon-" ID64 ".scope\n"), ID64);
	/* docker: systemd and cgroupfs */
	assert_string_equal(container_of("0::/system.slice/docker-" ID64 ".scope\n"), ID64);
	assert_string_equal(container_of("12:pids:/docker/" ID64 "\n"), ID64);
	/* kubernetes with containerd, cri-o, or the cgroupfs driver */
	assert_string_equal(container_of("0::/kubepods.slice/kubepods-burstable.slice/"
					 "kubepods-burstable-pod1234.slice/cri-containerd-" ID64
					 ".scope\n"), ID64);
	assert_string_equal(container_of("0::/kubepods.slice/crio-" ID64 ".scope\n"), ID64);
	assert_string_equal(container_of("0::/kubepods/besteffort/pod5678/" ID64 "\n"), ID64);
	/* lxc (4.0+ and before), systemd-nspawn (machined and the unit) */
	assert_string_equal(container_of("0::/lxc.payload.web1/init.scope\n"), "web1");
	assert_string_equal(container_of("3:cpu:/lxc/db2\n"), "db2");
	assert_string_equal(container_of("0::/machine.slice/machine-build\\x2d3.scope/payload\n"),
			    "build-3");
	assert_string_equal(container_of("0::/machine.slice/systemd-nspawn@deb12.service/payload\n"),
			    "deb12");
}

static void test_container_innermost_and_unified_first(void **state)
{
	/* docker in docker: the inner one is the process's */
	assert_string_equal(container_of("0::/docker/" ID64 "/docker/" ID64B "\n"), ID64B);
	/* the unified line wins over a v1 controller's, wherever it is */
	assert_string_equal(container_of("4:memory:/docker/" ID64 "\n"
					 "0::/system.slice/docker-" ID64B ".scope\n"), ID64B);
	/* a hybrid host whose unified line says nothing */
	assert_string_equal(container_of("9:name=systemd:/machine.slice/libpod-" ID64 ".scope\n"
					 "0::/\n"), ID64);
}

static void test_no_container_in_ordinary_paths(void **state)
{
	assert_string_equal(container_of("0::/user.slice/user-0.slice/session-3.scope\n"), "");
	assert_string_equal(container_of("0::/\n"), "");
	assert_string_equal(container_of("4:memory:/process_api/a9eb90d43f4dbd03c8f863d37fd6c3b9\n"),
			    "");
	assert_string_equal(container_of("0::/system.slice/docker.service\n"), "");
	assert_string_equal(container_of("0::/machine.slice\n"), "");
	/* 63 and 65 hex digits, upper case: not ids */
	assert_string_equal(container_of("0::/docker/" ID64 "0\n"), "");
	assert_string_equal(container_of("0::/docker-" "0123456789ABCDEF0123456789abcdef"
					 "0123456789abcdef0123456789abcdef.scope\n"), "");
	assert_string_equal(container_of(""), "");
	assert_string_equal(container_of("garbage"), "");
	/* a name with a control character is no name */
	assert_string_equal(container_of("0::/lxc.payload.a\\x0ab\n"), "");
}

/* Issue 22 §6: seen from a daemon whose own cgroup text is OWN. */
static const char *container_under(const char *text, const char *own)
{
	static char out[LOCKFS_CONTAINER_MAX];
	int rc = lockfs_container_of_cgroup_under(text, own, out, sizeof(out));

	assert_int_equal(rc, out[0] != '\0');
	return out;
}

static void test_container_named_from_the_daemons_own_cgroup(void **state)
{
	const char *own = "0::/machine.slice/libpod-" ID64 ".scope\n";

	/* the daemon's own container names nobody: its cgroup, or below */
	assert_string_equal(container_under("0::/machine.slice/libpod-" ID64 ".scope\n", own), "");
	assert_string_equal(container_under("0::/machine.slice/libpod-" ID64 ".scope/x\n", own),
			    "");
	/* a container started inside it is named by its own id */
	assert_string_equal(container_under("0::/machine.slice/libpod-" ID64 ".scope/libpod-"
					    ID64B ".scope\n", own), ID64B);
	/* a container elsewhere, and a path that only starts like ours */
	assert_string_equal(container_under("0::/machine.slice/libpod-" ID64B ".scope\n", own),
			    ID64B);
	assert_string_equal(container_under("0::/machine.slice/libpod-" ID64 ".scope2/docker/"
					    ID64B "\n", own), ID64B);
	/* a daemon at the root (or whose cgroup namespace makes it so) */
	assert_string_equal(container_under("0::/docker/" ID64 "\n", "0::/\n"), ID64);
	assert_string_equal(container_under("0::/docker/" ID64 "\n", NULL), ID64);
	/* hybrid: the unified line unchanged inside the daemon's container,
	 * the inner runtime's in a v1 controller, matched line by line */
	assert_string_equal(container_under("4:memory:/libpod-" ID64 ".scope/libpod_parent/libpod-"
					    ID64B "\n"
					    "0::/libpod-" ID64 ".scope\n",
					    "4:memory:/libpod-" ID64 ".scope\n"
					    "0::/libpod-" ID64 ".scope\n"), ID64B);
	/* a controller the daemon's text lacks is read whole */
	assert_string_equal(container_under("5:pids:/lxc/db2\n", own), "db2");
}

static void test_real_ns_of_a_process_in_our_pid_namespace(void **state)
{
	struct lockfs_proc p;

	memset(&p, 0, sizeof(p));
	p.pid = getpid();
	p.start_time = real_start_time(getpid());
	assert_int_equal(lockfs_procfs_source.read_ns(NULL, getpid(), &p), 0);
	assert_int_equal(p.ns_pid, getpid());
	assert_string_equal(p.container, "");
	/* again, now that it is known to be in our namespace */
	p.ns_pid = 0;
	assert_int_equal(lockfs_procfs_source.read_ns(NULL, getpid(), &p), 0);
	assert_int_equal(p.ns_pid, getpid());
	/* a process that is gone: an error, nothing made up */
	p.start_time++;
	assert_true(lockfs_procfs_source.read_ns(NULL, INT_MAX, &p) < 0);
	assert_int_equal(p.ns_pid, 0);
}

static void test_real_a_copy_of_a_system_binary_is_not_genuine(void **state)
{
	/* With `sleep` listed as a helper: /usr/bin/sleep is skipped, the very
	 * same bytes copied elsewhere are not. */
	char dir[] = "/tmp/lockfs-test-genuine-XXXXXX";
	char copy[PATH_MAX];
	const char *argv[] = { "sleep", "5", NULL };
	const char *envp[] = { NULL };
	struct lockfs_helpers h;
	struct lockfs_proc p;
	pid_t child;

	assert_int_equal(lockfs_helpers_parse(&h, "sleep"), 0);
	assert_non_null(mkdtemp(dir));
	snprintf(copy, sizeof(copy), "%s/sleep", dir);
	copy_exe("/usr/bin/sleep", copy);
	child = spawn(copy, argv, envp);
	assert_int_equal(lockfs_holder_resolve(&lockfs_procfs_source, child, geteuid(), &h, 0, &p), 0);
	assert_int_equal(p.pid, child);
	reap(child);
	child = spawn("/usr/bin/sleep", argv, envp);
	assert_int_equal(lockfs_holder_resolve(&lockfs_procfs_source, child, geteuid(), &h, 0, &p), 0);
	assert_int_equal(p.pid, getpid());
	reap(child);
	lockfs_helpers_free(&h);
	assert_int_equal(unlink(copy), 0);
	assert_int_equal(rmdir(dir), 0);
}

/* A source's optional functions answer in place of /proc; one it leaves
 * NULL falls back to the real /proc. */
static int canned_start_time(void *ctx, pid_t pid, unsigned long long *start)
{
	*start = 4242;
	return 0;
}

static int canned_env_exists(void *ctx, uid_t uid, const char *var, const char *value,
			   pid_t *pid)
{
	*pid = 77;
	return 1;
}

static void test_procs_ask_the_source_then_proc(void **state)
{
	struct lockfs_proc_source src = {
		.read_tid = fake_procs_read_tid,
		.start_time = canned_start_time,
		.env_exists = canned_env_exists,
	};
	unsigned long long start = 0, real = 0;
	pid_t pid = 0;
	char **argv = NULL;
	int fd;

	assert_int_equal(lockfs_proc_source_start_time(&src, getpid(), &start), 0);
	assert_int_equal(start, 4242);
	assert_int_equal(lockfs_proc_source_env_exists(&src, 0, "LOCKFS_SLUG", "x", &pid), 1);
	assert_int_equal(pid, 77);
	/* Left NULL: the real /proc. */
	assert_int_equal(lockfs_proc_source_start_time(NULL, getpid(), &start), 0);
	assert_int_equal(lockfs_procfs_start_time(getpid(), &real), 0);
	assert_true(start == real);
	assert_int_equal(lockfs_proc_source_cmdline(&src, getpid(), 4096, &argv), 0);
	assert_non_null(argv[0]);
	lockfs_argv_free(argv);
	fd = lockfs_proc_source_pidfd_open(&src, getpid());
	assert_true(fd >= 0 || fd == -ENOSYS); /* a kernel before 5.3 has none */
	if (fd >= 0)
		close(fd);
	assert_true(lockfs_proc_source_pidfd_open(&src, INT_MAX) < 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup_helpers, teardown_helpers)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(test_stat_parse_reads_the_fields_after_the_last_paren),
		T(test_stat_parse_refuses_what_is_not_a_stat_line),
		T(test_procfs_stat_reads_a_process_and_its_thread),
		cmocka_unit_test(test_container_ids_of_the_common_runtimes),
		cmocka_unit_test(test_container_innermost_and_unified_first),
		cmocka_unit_test(test_no_container_in_ordinary_paths),
		cmocka_unit_test(test_container_named_from_the_daemons_own_cgroup),
		cmocka_unit_test(test_real_read_self),
		cmocka_unit_test(test_real_comm_with_parens_and_spaces),
		cmocka_unit_test(test_real_resolve_self_with_no_helpers),
		cmocka_unit_test(test_real_thread_resolves_to_process_start_time),
		cmocka_unit_test(test_real_resolve_skips_helper_child),
		cmocka_unit_test(test_real_forked_child_may_release_our_lock),
		cmocka_unit_test(test_real_resolve_opens_a_live_pidfd),
		cmocka_unit_test(test_real_parent_may_not_release_childs_lock),
		cmocka_unit_test(test_real_vanished_caller_is_esrch),
		cmocka_unit_test(test_real_getenv_of_execd_child),
		cmocka_unit_test(test_real_cmdline_of_child),
		cmocka_unit_test(test_real_exe_deleted_and_busybox_applet),
		cmocka_unit_test(test_real_boot_id),
		cmocka_unit_test(test_real_ns_of_a_process_in_our_pid_namespace),
		cmocka_unit_test(test_real_a_copy_of_a_system_binary_is_not_genuine),
		cmocka_unit_test(test_procs_ask_the_source_then_proc),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
