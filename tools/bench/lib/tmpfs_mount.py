"""One lockfs daemon on a private tmpfs backing dir, for the benchmarks
that measure the mount itself (bench_slots.py, bench_deadlock.py): a tmpfs
so that the backing directory's own file system costs the same in every
run, and a `done` that undoes all of it, also when the run failed."""
import os
import subprocess
import tempfile
import time


def mounted(build, opts=(), prefix='lockfs-bench-', size='256m'):
    """Mount BUILD/lockfs with -o OPTS more; (mount point, backing dir, done)."""
    top = tempfile.mkdtemp(prefix=prefix)
    back, mnt = os.path.join(top, 'dir'), os.path.join(top, 'mnt')
    os.mkdir(back)
    os.mkdir(mnt)
    subprocess.check_call(['mount', '-t', 'tmpfs', '-o', f'size={size},mode=0700', 'tmpfs',
                           back])
    argv = [os.path.join(build, 'lockfs'), '-f', '-o', 'backing=' + back]
    for o in opts:
        argv += ['-o', o]
    daemon = subprocess.Popen(argv + [mnt], stdout=subprocess.DEVNULL)

    def done():
        if os.path.ismount(mnt) and subprocess.call(['fusermount3', '-u', mnt]) != 0:
            subprocess.call(['fusermount3', '-u', '-z', mnt])
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        subprocess.call(['umount', back])
        os.rmdir(back)
        subprocess.call(['chattr', '-i', mnt])
        os.rmdir(mnt)
        os.rmdir(top)

    t_end = time.monotonic() + 10
    while not os.path.ismount(mnt):
        if daemon.poll() is not None or time.monotonic() > t_end:
            done()
            raise SystemExit(f'{os.path.basename(build)}/lockfs did not mount')
        time.sleep(0.01)
    return mnt, back, done
