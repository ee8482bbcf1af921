"""Mount life cycle: background start, clean and lazy unmount, SIGTERM, dead daemons (case C11),
the --restart supervisor, refusals, and EIO only for real read failures."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from fuse_support import (S3_KEY, S3_SECRET, apply_dataset, cli, daemon_pid, force_cleanup, is_listed,
                      mount, sha256, sha256_path, wait_until)
from datacache.mountinfo import MountState, mounted_at, probe


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


_READER = textwrap.dedent("""
    import os, sys
    paths = sys.argv[1:]
    print("reading", flush=True)
    try:
        while True:  # open again and again: every open reaches the daemon
            for p in paths:
                with open(p, "rb") as f:
                    while f.read(1 << 20):
                        pass
    except OSError as err:
        print("errno", err.errno, flush=True)
""")


def test_c11_sigkill_gives_enotconn_then_mount_again(fuse_env, mountpoint):
    pid = mount(fuse_env, mountpoint)
    paths = [os.path.join(mountpoint, p) for p in fuse_env.shared_files if p.startswith("s3/")]
    reader = subprocess.Popen([sys.executable, "-c", _READER, *paths], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "reading"
        os.kill(pid, signal.SIGKILL)
        out, _ = reader.communicate(timeout=30)  # an error, not a hang
    finally:
        if reader.poll() is None:
            reader.kill()
            reader.wait()
    code = int(out.split()[-1])
    assert code in (errno.ENOTCONN, errno.ECONNABORTED), out
    for call in (os.listdir, os.statvfs, lambda p: open(os.path.join(p, "s3/medium.bin"), "rb")):
        with pytest.raises(OSError) as exc:
            call(mountpoint)
        assert exc.value.errno == errno.ENOTCONN
    assert is_listed(mountpoint) and probe(mountpoint) is MountState.DEAD

    # Mounting again on the corpse: detected, lazily unmounted, mounted afresh (no "File exists").
    pid2 = mount(fuse_env, mountpoint)
    assert pid2 != pid
    assert probe(mountpoint) is MountState.LIVE
    rel = "s3/medium.bin"
    assert sha256_path(os.path.join(mountpoint, rel)) == fuse_env.expected[rel]
    with open("/proc/self/mountinfo") as f:
        assert sum(line.split()[4] == mountpoint for line in f) == 1  # no stacked corpse below


def test_unmount_removes_a_dead_mount(fuse_env, mountpoint):
    pid = mount(fuse_env, mountpoint)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: probe(mountpoint, 2) is MountState.DEAD, 15, "the mount to be dead")
    r = cli("unmount", mountpoint, home=fuse_env.home)
    assert r.returncode == 0, r.stderr
    assert not is_listed(mountpoint)
    assert os.listdir(mountpoint) == []  # the plain directory again


def test_probe_across_a_lazy_unmount_is_not_live(fuse_env, mountpoint, monkeypatch):
    """A dead mount detached (by a re-mounting supervisor) between the probe's read of the mount
    table and its statvfs: the plain directory answers the statvfs, yet the probe must not call
    that LIVE (a JuiceFS re-mount test then read a file of the empty directory: ENOENT)."""
    import datacache.mountinfo as mountinfo

    pid = mount(fuse_env, mountpoint)
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: probe(mountpoint, 2) is MountState.DEAD, 15, "the mount to be dead")
    real, calls = mountinfo._statvfs, []

    def detached_first(path, timeout):
        if not calls:
            mountinfo.lazy_unmount(path)  # the real fusermount3, inside the window
        calls.append(path)
        return real(path, timeout)

    monkeypatch.setattr(mountinfo, "_statvfs", detached_first)
    assert probe(mountpoint, 2) is MountState.NONE
    assert len(calls) == 2 and not is_listed(mountpoint)


def test_unmount_of_a_hung_daemon_returns(fuse_env, mountpoint):
    """A stopped (hung) daemon: unmount must not touch the mount point (a stat would block)."""
    pid = mount(fuse_env, mountpoint)
    os.kill(pid, signal.SIGSTOP)
    try:
        r = cli("unmount", mountpoint, timeout=30, home=fuse_env.home)
        assert r.returncode == 0, r.stderr
        assert r.stdout.startswith(f"unmounted {mountpoint}"), r.stdout
        assert not is_listed(mountpoint)
    except BaseException:
        os.kill(pid, signal.SIGCONT)
        force_cleanup(fuse_env.home, mountpoint, pid)
        raise
    os.kill(pid, signal.SIGCONT)  # its session is gone: it exits
    wait_until(lambda: not os.path.exists(f"/proc/{pid}"), 15, "the daemon to exit once continued")


def test_restart_supervisor_remounts_after_sigkill(fuse_env, mountpoint):
    supervisor = mount(fuse_env, mountpoint, "--restart")
    try:
        first = wait_until(lambda: daemon_pid(fuse_env.home, mountpoint), 20, "the daemon's state file")
        assert first != supervisor
        os.kill(first, signal.SIGKILL)

        def remounted():
            pid = daemon_pid(fuse_env.home, mountpoint)
            return pid if pid and pid != first and probe(mountpoint, 2) is MountState.LIVE else None

        second = wait_until(remounted, 30, "the supervisor to mount again")
        rel = "s3/imgs/img_3.png"
        assert sha256_path(os.path.join(mountpoint, rel)) == fuse_env.expected[rel]

        r = cli("unmount", mountpoint, home=fuse_env.home)
        assert r.returncode == 0, r.stderr
        assert not is_listed(mountpoint)
        wait_until(lambda: not _alive(second), 15, "the daemon to exit")
        wait_until(lambda: not _alive(supervisor), 15, "the supervisor to exit after a clean unmount")
    finally:
        force_cleanup(fuse_env.home, mountpoint, supervisor)


def test_unmount_is_lazy_while_a_file_is_open(fuse_env, mountpoint):
    pid = mount(fuse_env, mountpoint)
    rel = "s3/medium.bin"
    src = fuse_env.source(rel)
    fd = os.open(os.path.join(mountpoint, rel), os.O_RDONLY)
    try:
        assert os.pread(fd, 1000, 0) == src[:1000]
        r = cli("unmount", mountpoint, home=fuse_env.home)  # returns at once: it names who holds files
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == (
            f"unmounted {mountpoint}; daemon {pid} keeps serving files still open in 1 process(es) "
            f"(pid {os.getpid()}) and exits when they are closed")
        assert not is_listed(mountpoint)  # the path is free at once
        assert os.pread(fd, len(src), 0) == src  # the open file still reads
        assert _alive(pid)
    finally:
        os.close(fd)
    wait_until(lambda: not _alive(pid), 15, "the daemon to exit once the last file is closed")
    assert daemon_pid(fuse_env.home, mountpoint) is None


def test_foreground_daemon_unmounts_on_sigterm(fuse_env, mountpoint):
    proc = subprocess.Popen([sys.executable, "-m", "datacache_fuse", "mount", fuse_env.name, mountpoint,
                             "--home", fuse_env.home, "-o", "allow_other,noatime", "--debug"],
                            stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: proc.poll() is not None or probe(mountpoint, 2) is MountState.LIVE, 60, "the mount")
        assert proc.poll() is None, proc.communicate()
        assert sorted(os.listdir(mountpoint)) == ["local", "s3"]
        top = mounted_at(mountpoint)
        assert top.fstype == "fuse.datacache" and top.source == f"datacache:default/{fuse_env.name}"
        assert {"ro", "allow_other", "default_permissions"} <= set(top.options.split(","))
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0, err
        assert not is_listed(mountpoint)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_mount_refuses_a_live_mount(fuse_env, mountpoint):
    mount(fuse_env, mountpoint)
    r = cli("mount", fuse_env.name, mountpoint, "--background", home=fuse_env.home)
    assert r.returncode == 1
    assert "already mounted" in r.stderr and "Traceback" not in r.stderr
    with open("/proc/self/mountinfo") as f:
        assert sum(line.split()[4] == mountpoint for line in f) == 1
    assert sorted(os.listdir(mountpoint)) == ["local", "s3"]  # the first mount is untouched


def test_mount_refuses_a_nonempty_directory_unless_allowed(fuse_env, mountpoint):
    with open(os.path.join(mountpoint, "mine.txt"), "w") as f:
        f.write("keep me")
    for extra in (["--background"], []):  # the CLI's check, and the daemon's own
        r = cli("mount", fuse_env.name, mountpoint, *extra, home=fuse_env.home)
        assert r.returncode == 1, r
        assert r.stderr.strip() == (f"error: {mountpoint} is not empty: a mount would hide its files; use an "
                                    f"empty directory, or pass --allow-nonempty to mount over them")
        assert not is_listed(mountpoint)
    mount(fuse_env, mountpoint, "--allow-nonempty")
    assert sorted(os.listdir(mountpoint)) == ["local", "s3"]
    r = cli("unmount", mountpoint, home=fuse_env.home)
    assert r.returncode == 0, r.stderr
    with open(os.path.join(mountpoint, "mine.txt")) as f:
        assert f.read() == "keep me"  # hidden while mounted, untouched


def test_mount_on_a_regular_file_is_refused_before_any_daemon_starts(fuse_env, tmp_path):
    path = str(tmp_path / "a-file")
    with open(path, "w") as f:
        f.write("not a directory")
    for extra in (["--background"], []):  # the CLI's check, and the daemon's own
        r = cli("mount", fuse_env.name, path, *extra, home=fuse_env.home)
        assert r.returncode == 1, r
        assert r.stderr.strip() == (f"error: {path} exists and is not a directory: give an empty directory as the "
                                    "mount point (or a path to create)")
    with open(path) as f:
        assert f.read() == "not a directory"


def test_mount_refuses_max_read(fuse_env, mountpoint):
    r = cli("mount", fuse_env.name, mountpoint, "-o", "max_read=1048576", home=fuse_env.home)
    assert r.returncode == 1 and "max_read" in r.stderr and "Traceback" not in r.stderr
    assert not is_listed(mountpoint)


def test_mount_of_unknown_dataset_fails_cleanly(fuse_env, mountpoint):
    for extra in (["--background", "--timeout", "30"], []):  # refused before any daemon starts
        r = cli("mount", "no-such-dataset", mountpoint, *extra, home=fuse_env.home)
        assert r.returncode == 1
        assert r.stderr.strip() == ("error: dataset default/no-such-dataset not found: apply it first "
                                    "(datacache apply -f FILE); see 'datacache get datasets'")
        assert not is_listed(mountpoint)


def test_unmount_of_a_plain_directory_is_an_error(fuse_env, mountpoint):
    r = cli("unmount", mountpoint, home=fuse_env.home)
    assert r.returncode == 1 and r.stderr == f"error: {mountpoint} is not mounted\n"
    missing = os.path.join(mountpoint, "nope")  # a typo: named as missing, not as unmounted
    r = cli("unmount", missing, home=fuse_env.home)
    assert (r.returncode, r.stderr) == (1, f"error: {missing} does not exist: give the directory a dataset is "
                                           "mounted at ('findmnt -t fuse.datacache' lists them)\n")


def test_eio_only_when_the_ufs_is_down_and_the_block_is_not_cached(fuse_available, tmp_path):
    """Cached data still reads with the UFS gone; uncached data fails fast with EIO; a missing
    path is still ENOENT, never EIO."""
    from datacache.demo.s3server import MotoServer

    home, mp = str(tmp_path / "home"), str(tmp_path / "mnt")
    os.makedirs(home, mode=0o700)
    os.makedirs(mp)
    a, b = os.urandom(300_000), os.urandom(300_000)
    server = MotoServer().start()
    try:
        fs = server.s3fs(key=S3_KEY, secret=S3_SECRET)
        fs.mkdir("eiobkt")
        fs.pipe({"eiobkt/data/a.bin": a, "eiobkt/data/b.bin": b})
        apply_dataset(home, "fuseeio", server.endpoint_url, "eiobkt", None)
        r = cli("mount", "fuseeio", mp, "--background", home=home)
        assert r.returncode == 0, r.stderr
        with open(os.path.join(mp, "a.bin"), "rb") as f:
            assert f.read() == a  # now cached
        server.stop()

        with open(os.path.join(mp, "a.bin"), "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)  # force the daemon's path
            assert sha256(f.read()) == sha256(a)
        assert os.stat(os.path.join(mp, "b.bin")).st_size == len(b)  # metadata: the manifest
        with pytest.raises(FileNotFoundError):
            os.stat(os.path.join(mp, "c.bin"))

        result: dict = {}

        def read_b():
            try:
                with open(os.path.join(mp, "b.bin"), "rb") as f:
                    result["data"] = f.read()
            except OSError as err:
                result["errno"] = err.errno

        t = threading.Thread(target=read_b, daemon=True)
        started = time.monotonic()
        t.start()
        t.join(60)
        print(f"EIO after {time.monotonic() - started:.1f} s")
        assert not t.is_alive(), "a read with the UFS down hung"
        assert result.get("errno") == errno.EIO, result.keys()
        _assert_no_secret_in_logs(home)
    finally:
        server.stop()
        force_cleanup(home, mp)


def _assert_no_secret_in_logs(home: str) -> None:
    logs = os.path.join(home, "logs")
    names = os.listdir(logs)
    assert names
    for name in names:
        with open(os.path.join(logs, name), encoding="utf-8", errors="replace") as f:
            text = f.read()
        assert S3_SECRET not in text and S3_KEY not in text, name
        assert os.stat(os.path.join(logs, name)).st_mode & 0o077 == 0  # 0600


def test_logs_name_no_secrets(fuse_env, mnt):
    assert sorted(os.listdir(mnt)) == ["local", "s3"]
    _assert_no_secret_in_logs(fuse_env.home)


def test_a_killed_harness_leaves_no_mount_behind(fuse_env, mountpoint):
    """19.17: a daemon started under $DATACACHE_FUSE_WATCH_PID (the test runner's pid, set in
    tests/conftest.py) unmounts and exits when that process dies, even by SIGKILL."""
    harness = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    env = {**os.environ, "DATACACHE_FUSE_WATCH_PID": str(harness.pid)}
    started = subprocess.run([sys.executable, "-m", "datacache_fuse", "mount", fuse_env.name, mountpoint,
                              "--background", "--home", fuse_env.home], env=env, stdin=subprocess.DEVNULL,
                             capture_output=True, text=True, timeout=90)
    pid = None
    try:
        assert started.returncode == 0, started.stderr
        pid = daemon_pid(fuse_env.home, mountpoint)
        assert pid and is_listed(mountpoint)
        harness.kill()
        harness.wait()
        wait_until(lambda: not is_listed(mountpoint) and not _alive(pid), 10, "the mount to go with its harness")
        assert probe(mountpoint) is MountState.NONE
    finally:
        harness.kill()
        force_cleanup(fuse_env.home, mountpoint, pid)


def test_a_watch_pid_that_is_not_a_pid_is_refused_before_mounting(fuse_env, mountpoint):
    env = {**os.environ, "DATACACHE_FUSE_WATCH_PID": "runner"}
    r = subprocess.run([sys.executable, "-m", "datacache_fuse", "mount", fuse_env.name, mountpoint, "--home",
                        fuse_env.home], env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=90)
    try:
        assert r.returncode == 1 and "DATACACHE_FUSE_WATCH_PID='runner' is not a process id" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr and not is_listed(mountpoint)
    finally:
        force_cleanup(fuse_env.home, mountpoint)


def test_a_missing_mount_point_is_created_private(fuse_env, mountpoint):
    """The README's promise: a missing DIR is created with mode 0700, whatever the umask."""
    target = os.path.join(mountpoint, "made", "here")
    old = os.umask(0o022)
    try:
        pid = mount(fuse_env, target)
    finally:
        os.umask(old)
    try:
        assert is_listed(target)
    finally:
        assert cli("unmount", target, home=fuse_env.home).returncode == 0
        force_cleanup(fuse_env.home, target, pid)
    assert os.stat(target).st_mode & 0o777 == 0o700


def test_a_mount_without_its_secrets_warns_and_serves_the_listing(fuse_env, mountpoint):
    # It mounted silently, and every read of what is not cached then failed with EIO.
    secrets = os.path.join(fuse_env.home, "secrets")
    os.rename(secrets, secrets + ".away")
    try:
        r = cli("mount", fuse_env.name, mountpoint, "--background", home=fuse_env.home)
        assert r.returncode == 0, r.stderr
        assert r.stderr.splitlines() == [  # one line per missing key
            f"warning: dataset {fuse_env.name!r}: spec.mounts[0].encryptOptions[{i}]: secret 'moto' key '{key}' not "
            f"found: set the environment variable DATACACHE_SECRET_MOTO_{key.upper()} or write the value to "
            f"{secrets}/moto/{key}; until then only cached blocks can be read, other reads fail with EIO"
            for i, key in enumerate(("key", "secret"))]
        assert sorted(os.listdir(mountpoint)) == ["local", "s3"]  # the synced listing needs no secret
    finally:
        os.rename(secrets + ".away", secrets)
        cli("unmount", mountpoint, home=fuse_env.home)
