"""The Debian package (tools/deb/build-deb.sh, docs/operations.md).

Builds lockfs_VERSION_ARCH.deb from this tree, checks its control fields,
its files and lintian's verdict, and installs it on a brand-new minbase
Debian 12 (tools/deb/fresh-install.sh: a podman container), where it is
started, used, purged, and nothing of it may be left.
"""

import os
import re
import shutil
import subprocess

import pytest

SRC = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _meson_version():
    with open(os.path.join(SRC, 'meson.build')) as f:
        return re.search(r"version\s*:\s*'([^']+)'", f.read()).group(1)


@pytest.fixture(scope='module')
def deb(tmp_path_factory):
    for tool in ('dpkg-deb', 'dpkg-shlibdeps', 'meson'):
        if not shutil.which(tool):
            pytest.skip(f'{tool} is not installed (apt-get install dpkg-dev meson)')
    out = tmp_path_factory.mktemp('deb')
    r = subprocess.run([os.path.join(SRC, 'tools/deb/build-deb.sh'), str(out / 'build'), str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-4000:]
    path = r.stdout.strip().splitlines()[-1]
    arch = subprocess.run(['dpkg', '--print-architecture'], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert os.path.basename(path) == f'lockfs_{_meson_version()}_{arch}.deb'
    return path


def _field(deb, name):
    return subprocess.run(['dpkg-deb', '-f', deb, name], capture_output=True, text=True,
                          check=True).stdout.strip()


def _files(deb):
    out = subprocess.run(['dpkg-deb', '-c', deb], capture_output=True, text=True,
                         check=True).stdout
    # "-rw-r--r-- root/root 890 2026-12-06 02:09 ./etc/x" (a symlink adds "-> T")
    return {line.split()[5][1:]: line for line in out.splitlines()}


def test_control_fields(deb):
    assert _field(deb, 'Package') == 'lockfs'
    assert _field(deb, 'Version') == _meson_version()
    depends = [d.split()[0] for d in _field(deb, 'Depends').split(', ')]
    # dpkg-shlibdeps' libraries of lockfs and lockctl
    for lib in ('libc6', 'libfuse3-3', 'libjansson4', 'libunistring2', 'libsystemd0', 'libcurl4'):
        assert lib in depends, depends
    # tools/packages.txt's run packages, less the Essential ones
    with open(os.path.join(SRC, 'tools/packages.txt')) as f:
        run = [line.split()[1] for line in f if line.startswith('run ')]
    assert run
    for pkg in run:
        essential = subprocess.run(['dpkg-query', '-W', '-f=${Essential}', pkg],
                                   capture_output=True, text=True).stdout
        assert (pkg in depends) == (essential != 'yes'), (pkg, depends)


def test_files(deb):
    files = _files(deb)
    for path in ('/usr/bin/lockfs', '/usr/bin/lockctl', '/usr/bin/lockctl-static',
                 '/usr/sbin/lockfs-mountpoint',
                 '/lib/systemd/system/lockfs.service', '/lib/systemd/system/lockfs@.service',
                 '/usr/share/man/man8/lockfs.8.gz', '/usr/share/man/man1/lockctl.1.gz',
                 '/usr/share/man/man8/lockfs-mountpoint.8.gz',
                 '/usr/share/man/man1/lockctl-static.1.gz',
                 '/etc/logrotate.d/lockfs',
                 '/usr/share/doc/lockfs/README.md', '/usr/share/doc/lockfs/copyright',
                 '/usr/share/doc/lockfs/changelog.gz'):
        assert path in files, path
    docs = sorted(f for f in os.listdir(os.path.join(SRC, 'docs')) if f.endswith('.md'))
    for name in docs:
        assert f'/usr/share/doc/lockfs/docs/{name}' in files, name
    assert not [p for p in files if '/design' in p]
    for path, line in files.items():
        assert ' root/root ' in line, line
        assert line[5] != 'w' and line[8] != 'w' or line[0] == 'l', line
    assert _control_file(deb, 'conffiles').split() == ['/etc/logrotate.d/lockfs']
    # The units run the installed programs, under /usr.
    unit = _data_file(deb, './lib/systemd/system/lockfs.service')
    assert 'ExecStart=/usr/bin/lockfs -f ' in unit
    assert 'ExecStartPre=/usr/sbin/lockfs-mountpoint prepare ' in unit


def _control_file(deb, name):
    return subprocess.run(f'dpkg-deb --ctrl-tarfile {deb} | tar -xOf - ./{name}', shell=True,
                          capture_output=True, text=True, check=True).stdout


def _data_file(deb, name):
    return subprocess.run(f'dpkg-deb --fsys-tarfile {deb} | tar -xOf - {name}', shell=True,
                          capture_output=True, text=True, check=True).stdout


def test_man_pages_name_the_installed_docs(deb):
    for page in ('./usr/share/man/man8/lockfs.8.gz', './usr/share/man/man1/lockctl.1.gz'):
        text = subprocess.run(f'dpkg-deb --fsys-tarfile {deb} | tar -xOf - {page} | zcat',
                              shell=True, capture_output=True, text=True, check=True).stdout
        assert '/usr/share/doc/lockfs/' in text, page


def test_lintian(deb):
    if not shutil.which('lintian'):
        pytest.skip('lintian is not installed (apt-get install lintian)')
    r = subprocess.run(['lintian', '--tag-display-limit', '0', deb], capture_output=True, text=True)
    bad = [line for line in r.stdout.splitlines() if line[:2] in ('E:', 'W:')]
    assert not bad, r.stdout + r.stderr


def test_fresh_debian12_install_use_purge(deb):
    if os.geteuid() != 0:
        pytest.skip('needs root: a privileged podman container')
    for tool in ('mmdebstrap', 'podman', 'runc'):
        if not shutil.which(tool):
            pytest.skip(f'{tool} is not installed (apt-get install mmdebstrap podman runc)')
    r = subprocess.run([os.path.join(SRC, 'tools/deb/fresh-install.sh'), deb],
                       capture_output=True, text=True, timeout=900)
    out = r.stdout + r.stderr
    print('\n'.join(line for line in out.splitlines() if line.startswith('fresh-install:')))
    if r.returncode == 77:
        pytest.skip(out.strip().splitlines()[-1])
    assert r.returncode == 0, out[-6000:]
    assert 'apt-get install ./lockfs_*.deb took' in out
    assert '"resource": "x"' in out
    assert 'fresh-install: purge left nothing behind' in out
    assert 'fresh-install: under systemd: install enabled and started lockfs.service' in out
    assert ('fresh-install: under systemd: removal stopped lockfs.service, purge left no unit'
            ' or enablement') in out
    assert out.rstrip().endswith('fresh-install: OK')
