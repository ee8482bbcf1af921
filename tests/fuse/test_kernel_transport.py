"""The kernel transport (datacache_fuse.kernel) over real mounts of a small tree.

A :class:`MirrorOperations` file system serves a temp directory through :class:`FuseServer` in
three modes: reads through the daemon (READ), kernel passthrough, and no-open mode. Bytes are
compared by SHA-256 with the source; request counts come from the session (what the kernel sent)
and from the operations (what was called).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time

import pytest

from datacache.demo.sample_data import sha256_bytes as sha
from datacache.demo.sample_data import sha256_file as sha_file
from datacache import mountinfo
from datacache_fuse.kernel.abi import ROOT_ID, Op
from datacache_fuse.kernel.mirror import MirrorOperations
from datacache_fuse.kernel.operations import OpenOut
from datacache_fuse.kernel.server import FuseServer
from fuse_support import uring_enabled, wait_until

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/fuse") or os.geteuid() != 0,
                                reason="needs /dev/fuse and root (mount(2) of a FUSE file system)")

SIZES = {"empty.bin": 0, "one.bin": 1, "page-1.bin": 4095, "mib+1.bin": (1 << 20) + 1, "big.bin": 64 << 20}
MANY = 1000


def mmap_sha(path: str) -> str:
    """SHA-256 of ``path`` read through ``mmap`` in a child process: a page fault on the mount
    holds this process's GIL, which the serving threads need (it would deadlock in-process)."""
    code = ("import hashlib, mmap, sys\n"
            "with open(sys.argv[1], 'rb') as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:\n"
            "    print(hashlib.sha256(m[:]).hexdigest())")
    return subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, check=True,
                          timeout=60).stdout.strip()


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """``(root, {relpath: sha256})``: files of every size, nested dirs, a 1,000-entry dir, xattrs."""
    root = str(tmp_path_factory.mktemp("tree"))
    digests = {}
    for name, size in SIZES.items():
        data = os.urandom(size)
        with open(os.path.join(root, name), "wb") as f:
            f.write(data)
        digests[name] = sha(data)
    os.makedirs(os.path.join(root, "a", "b", "c"))
    with open(os.path.join(root, "a", "b", "c", "deep.txt"), "wb") as f:
        f.write(b"deep\n")
    digests["a/b/c/deep.txt"] = sha(b"deep\n")
    os.mkdir(os.path.join(root, "many"))
    for i in range(MANY):
        with open(os.path.join(root, "many", f"f{i:04d}"), "wb") as f:
            f.write(b"x" * (i % 7))
    os.setxattr(os.path.join(root, "one.bin"), "user.note", b"hello")
    os.setxattr(os.path.join(root, "one.bin"), "user.long", b"v" * 300)
    yield root, digests
    base = str(tmp_path_factory.getbasetemp())
    leftovers = [m.mountpoint for m in mountinfo.mounts()  # this module's mounts (fsname "datacache"), not
                 if m.mountpoint.startswith(base) and m.source == "datacache"]  # other modules' dataset mounts
    assert not leftovers, f"FUSE mounts left behind: {leftovers}"


def serve(root: str, mp: str, uring: bool = False, **kwargs) -> tuple[FuseServer, MirrorOperations]:
    """Mount a mirror of ``root`` at ``mp``; ``kwargs`` are MirrorOperations' options; ``uring``:
    FUSE over io_uring (see :func:`fuse_support.uring_enabled`)."""
    os.makedirs(mp, exist_ok=True)
    ops = MirrorOperations(root, **kwargs)
    server = FuseServer(ops, mp, fsname="datacache:test/tree", passthrough=ops.passthrough, uring=uring)
    server.start()
    return server, ops


MODES = {
    "read": dict(passthrough=False),
    "passthrough": dict(passthrough=True),
    "no-open": dict(no_open=True, readdirplus=True),
    # The same over FUSE over io_uring: requests come on per-CPU ring queues, not /dev/fuse.
    "read-uring": dict(passthrough=False, uring=True),
    "no-open-uring": dict(no_open=True, readdirplus=True, uring=True),
}


@pytest.fixture(scope="module", params=list(MODES))
def mounted(request, tree, tmp_path_factory):
    """``(mode, mountpoint, server, ops)`` for each mode, one mount per mode."""
    root, _ = tree
    mp = str(tmp_path_factory.mktemp(f"mnt-{request.param}"))
    with uring_enabled(MODES[request.param].get("uring", False)):
        server, ops = serve(root, mp, **MODES[request.param])
    try:
        if MODES[request.param].get("uring"):
            assert server.session.rings and all(q.error is None for q in server.session.rings)
        else:
            assert not server.session.rings
        yield request.param, mp, server, ops
    finally:
        assert server.stop(timeout=10), "the session did not end after unmount"
        assert server.session.alive_workers == 0  # ring threads too


# -- names, attributes, directories -----------------------------------------------------------------
def test_tree_lookup_stat_readdir(mounted, tree):
    mode, mp, server, _ = mounted
    root, _ = tree
    assert sorted(os.listdir(mp)) == sorted(os.listdir(root))
    assert os.listdir(os.path.join(mp, "a", "b", "c")) == ["deep.txt"]
    for rel in ("a", "a/b", "a/b/c", "a/b/c/deep.txt", "mib+1.bin", "empty.bin"):
        got, want = os.stat(os.path.join(mp, rel)), os.stat(os.path.join(root, rel))
        assert (stat.S_IFMT(got.st_mode), got.st_size, got.st_mtime_ns) == \
               (stat.S_IFMT(want.st_mode), want.st_size, want.st_mtime_ns), rel
    names = os.listdir(os.path.join(mp, "many"))
    assert sorted(names) == [f"f{i:04d}" for i in range(MANY)]  # several READDIR requests of 1,000
    sizes = {e.name: e.stat().st_size for e in os.scandir(os.path.join(mp, "many"))}
    assert sizes == {f"f{i:04d}": i % 7 for i in range(MANY)}
    assert all(e.is_file() for e in os.scandir(os.path.join(mp, "many")))
    counts = server.session.counts()
    if mode.startswith("no-open"):  # READDIRPLUS answered; OPENDIR answered once at most
        assert counts[Op.READDIRPLUS] >= 2
    else:
        assert counts[Op.READDIR] >= 2 and counts[Op.READDIRPLUS] == 0


def test_missing_path_is_enoent(mounted):
    _, mp, _, _ = mounted
    with pytest.raises(FileNotFoundError):
        os.stat(os.path.join(mp, "no-such-file"))
    with pytest.raises(FileNotFoundError):
        open(os.path.join(mp, "a", "nope.txt"), "rb")


def test_writes_are_erofs(mounted):
    _, mp, _, _ = mounted
    for action in (lambda: open(os.path.join(mp, "new.txt"), "wb"),
                   lambda: open(os.path.join(mp, "one.bin"), "r+b"),
                   lambda: os.mkdir(os.path.join(mp, "newdir")),
                   lambda: os.unlink(os.path.join(mp, "one.bin")),
                   lambda: os.setxattr(os.path.join(mp, "one.bin"), "user.x", b"1")):
        with pytest.raises(OSError) as err:
            action()
        assert err.value.errno == errno.EROFS


def test_statfs_is_the_source_file_systems(mounted, tree):
    _, mp, _, _ = mounted
    got, want = os.statvfs(mp), os.statvfs(tree[0])
    assert (got.f_blocks, got.f_frsize, got.f_namemax) == (want.f_blocks, want.f_frsize, want.f_namemax)


def test_xattrs(mounted):
    _, mp, _, _ = mounted
    path = os.path.join(mp, "one.bin")
    assert os.getxattr(path, "user.note") == b"hello"
    assert os.getxattr(path, "user.long") == b"v" * 300  # needs a second, larger GETXATTR (ERANGE)
    assert {"user.note", "user.long"} <= set(os.listxattr(path))
    with pytest.raises(OSError) as err:
        os.getxattr(path, "user.missing")
    assert err.value.errno == errno.ENODATA


# -- data -------------------------------------------------------------------------------------------
def test_reads_equal_the_source(mounted, tree):
    mode, mp, server, ops = mounted
    _, digests = tree
    for rel, digest in digests.items():
        assert sha_file(os.path.join(mp, rel)) == digest, (mode, rel)
    assert mmap_sha(os.path.join(mp, "mib+1.bin")) == digests["mib+1.bin"]
    with open(os.path.join(mp, "big.bin"), "rb") as f:
        f.seek((32 << 20) - 5)
        with open(os.path.join(tree[0], "big.bin"), "rb") as src:
            src.seek((32 << 20) - 5)
            assert f.read(4096 + 11) == src.read(4096 + 11)  # an unaligned read across pages
        assert not f.isatty()  # IOCTL answered ENOTTY
    counts = server.session.counts()
    if mode == "passthrough":
        # The kernel read the backing files itself: not one READ, and read() was never called.
        assert counts[Op.READ] == 0 and ops.calls["read"] == 0
        assert counts[Op.OPEN] >= len(digests) and server.session.backing.refused == 0
        wait_until(lambda: server.session.backing.held == 0, 5, "the backing id's release with the last handle")
        # One BACKING_OPEN per file: the reopens (mmap, the seek) reused the idle backing ids.
        assert server.session.backing.registered == server.session.backing.open_ids == len(digests)
    else:
        assert counts[Op.READ] > 0 and ops.calls["read"] > 0
    if mode.endswith("-uring"):  # what the kernel sent came on the ring queues, IOCTL answered there
        ringed = collections.Counter()
        for queue in server.session.rings:
            ringed.update(queue.counter)
            ringed[Op.IOCTL] += queue.ioctls  # those the compiled loop answered
        assert ringed[Op.READ] == counts[Op.READ] > 0 and ringed[Op.IOCTL] >= 1
    if mode.startswith("no-open"):
        # OPEN answered ENOSYS once; from then on the kernel opens without asking.
        assert counts[Op.OPEN] == 1 and ops.calls["open"] == 1 and counts[Op.RELEASE] == 0
        assert server.session.no_open
    else:
        assert counts[Op.IOCTL] >= 1


@pytest.mark.parametrize("uring", [False, True], ids=["dev", "uring"])
@pytest.mark.parametrize("compiled", [True, False], ids=["c-pump", "python"])
def test_isatty_of_each_buffered_open_is_answered_enotty(tree, tmp_path, monkeypatch, compiled, uring):
    """Each buffered ``open()`` asks ``isatty()``: one IOCTL per file, answered ENOTTY by the C
    loop of its transport (``/dev/fuse`` or a ring queue; never reaching Python) when it was
    built, else by the Python loop; both count them, before answering."""
    import datacache_fuse.kernel.ring_queue as ring_module
    import datacache_fuse.kernel.session as session_module
    from datacache_fuse.kernel.pump import load, load_ring

    assert load() is not None and load_ring() is not None, \
        "datacache_fuse.kernel._pump was not built (pip install needs gcc)"
    if not compiled:
        monkeypatch.setattr(session_module, "load_pump", lambda: None)
        monkeypatch.setattr(ring_module, "load_ring", lambda: None)
    root, digests = tree
    with uring_enabled(uring):
        server, _ = serve(root, str(tmp_path / "mnt"), uring=uring, no_open=True)
    try:
        assert bool(server.session.rings) == uring
        names = sorted(n for n in SIZES if SIZES[n] < (1 << 20)) * 5
        for name in names:
            with open(os.path.join(server.mountpoint, name), "rb") as f:
                assert not f.isatty() and sha(f.read()) == digests[name]
        counts = server.session.counts()
        assert counts[Op.IOCTL] == 2 * len(names)  # open()'s own isatty() and the test's
        assert all(q.error is None for q in server.session.rings)
        on_rings = sum(q.ioctls for q in server.session.rings)
        in_c = sum(p.ioctls for p in server.session._pumps) + on_rings
        assert in_c == (counts[Op.IOCTL] if compiled else 0)
        if uring:  # every request came on the ring queues once they were ready
            assert on_rings == (counts[Op.IOCTL] if compiled else 0)
    finally:
        assert server.stop(timeout=10)


def test_parallel_readers(mounted, tree):
    _, mp, _, _ = mounted
    _, digests = tree
    results, errors = {}, []

    def reader(i: int) -> None:
        try:
            with open(os.path.join(mp, "big.bin"), "rb") as f:
                f.seek(i * (8 << 20))
                results[i] = sha(f.read(8 << 20))
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    with open(os.path.join(tree[0], "big.bin"), "rb") as src:
        want = {i: sha(src.read(8 << 20)) for i in range(8)}
    assert results == want


class SlowMirror(MirrorOperations):
    """Reads that take 20 ms and record how many ran at once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.active = self.peak = 0

    def read(self, ino, fh, offset, size):
        with self._lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            time.sleep(0.02)
            return super().read(ino, fh, offset, size)
        finally:
            with self._lock:
                self.active -= 1


def test_workers_serve_requests_in_parallel(tree, tmp_path):
    root, digests = tree
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    ops = SlowMirror(root)
    server = FuseServer(ops, mp, workers=4, passthrough=False)
    server.start()
    try:
        names = ["one.bin", "page-1.bin", "mib+1.bin", "a/b/c/deep.txt"]
        got = {}
        threads = [threading.Thread(target=lambda n=n: got.__setitem__(n, sha_file(os.path.join(mp, n))))
                   for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert got == {n: digests[n] for n in names}
        assert ops.peak >= 2, "reads were served one at a time"
    finally:
        assert server.stop()


class HeldMirror(MirrorOperations):
    """Reads of ``held`` files wait until ``release`` is set; ``waiting`` counts them."""

    def __init__(self, *args, held=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.held = {os.fsencode(n) for n in held}
        self.release = threading.Event()
        self.waiting = 0

    def read(self, ino, fh, offset, size):
        if os.fsencode(os.path.basename(self._path(ino)[1])) in self.held:
            with self._lock:
                self.waiting += 1
            try:
                self.release.wait(30)
            finally:
                with self._lock:
                    self.waiting -= 1
        return super().read(ino, fh, offset, size)


def test_held_up_readers_hand_their_turn_off(tree, tmp_path):
    """2 of 6 workers read requests at a time; 3 reads held up (a cold block waiting on the UFS)
    hand their turns off, so all 3 are answered at once and a fourth file is served meanwhile."""
    root, digests = tree
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    held = ["one.bin", "page-1.bin", "mib+1.bin"]
    ops = HeldMirror(root, passthrough=False, held=held)
    server = FuseServer(ops, mp, workers=6, readers=2, passthrough=False)
    session = server.start()
    got = {}
    threads = [threading.Thread(target=lambda n=n: got.__setitem__(n, sha_file(os.path.join(mp, n)))) for n in held]
    try:
        assert session.gate.readers == 2
        for t in threads:
            t.start()
        wait_until(lambda: ops.waiting == 3, 5, "3 held reads to reach the daemon")
        assert sha_file(os.path.join(mp, "a/b/c/deep.txt")) == digests["a/b/c/deep.txt"]
        assert session.gate.handoffs >= 2  # the third held read and deep.txt needed a turn each
    finally:
        ops.release.set()
        for t in threads:
            t.join(30)
        assert server.stop(timeout=10)
    assert got == {n: digests[n] for n in held}
    assert session.alive_workers == 0  # workers waiting for a turn ended too, and the gate's watcher


# -- passthrough refused, invalidation, mounting ---------------------------------------------------
class RefusedPassthrough(MirrorOperations):
    """Names a directory as the backing file: the kernel refuses it (no read_iter)."""

    def open(self, ino, flags, req):
        out = super().open(ino, flags, req)
        return OpenOut(fh=out.fh, keep_cache=True, passthrough=self.root)


def test_refused_passthrough_falls_back_to_read(tree, tmp_path, caplog):
    root, digests = tree
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    ops = RefusedPassthrough(root)
    with caplog.at_level(logging.WARNING, logger="datacache_fuse"):
        with FuseServer(ops, mp, passthrough=True) as server:
            assert server.session.passthrough
            for name in ("one.bin", "mib+1.bin", "page-1.bin"):
                assert sha_file(os.path.join(mp, name)) == digests[name]
            assert ops.calls["read"] > 0 and server.session.backing.refused == 3
            assert server.session.backing.open_ids == 0
    told = [r.getMessage() for r in caplog.records if "passthrough of" in r.getMessage()]
    assert len(told) == 1, told  # said once, not per file


def _listed(server) -> dict:
    """The compiled loops' table: ``{inode: (backing id, handles open, retired)}`` of its used slots."""
    table = server.session.backing.fast.table
    return {table.slots[i].nodeid: (table.slots[i].backing_id, table.slots[i].handles, bool(table.slots[i].retired))
            for i in range(table.size) if table.slots[i].nodeid}


@pytest.mark.parametrize("uring", [False, True], ids=["dev", "uring"])
def test_reopens_of_a_passed_through_file_are_answered_in_c_with_its_bytes(tree, tmp_path, uring):
    """After its first OPEN (Python's), a file's read-only OPENs and their RELEASEs are answered by
    the compiled loop of the transport: the operations' ``open`` runs once per file, every byte
    still comes from the backing file, ``reopened`` is told of each reopen, and an open for
    writing still reaches Python (EROFS)."""
    root, digests = tree
    names = ["one.bin", "page-1.bin", "mib+1.bin", "a/b/c/deep.txt"]
    with uring_enabled(uring):
        server, ops = serve(root, str(tmp_path / "mnt"), uring=uring, passthrough=True, reopen=True)
    try:
        assert server.session.backing.fast is not None, "datacache_fuse.kernel._pump was not built"
        for _ in range(5):
            for name in names:
                with open(os.path.join(server.mountpoint, name), "rb") as f:
                    assert sha(f.read()) == digests[name], name
        assert ops.calls["open"] == len(names)  # the first open of each
        assert server.session.backing.fast.opens == 4 * len(names)
        assert server.session.counts()[Op.OPEN] == 5 * len(names)
        assert ops.calls["read"] == 0 and server.session.backing.refused == 0
        wait_until(lambda: ops.calls["reopened"] == 4 * len(names), 5, "the reopens told to the operations")
        listed = _listed(server)
        assert len(listed) == len(names) and all(h == 0 and not r for _, h, r in listed.values())
        # each listed inode holds its backing id (the table's handle); nothing else is open
        assert server.session.backing.held == len(names) == server.session.backing.registered
        with pytest.raises(OSError) as err:
            open(os.path.join(server.mountpoint, "one.bin"), "r+b")
        assert err.value.errno == errno.EROFS
        assert ops.calls["open"] == len(names)  # refused before the operations' open, by Python
        if uring:
            assert all(q.error is None for q in server.session.rings)
        # idle: the thread that tells the reopens sleeps on its eventfd (it woke every 20 ms before)
        (teller,) = [t for t in threading.enumerate() if t.name == f"{server.session.name}-reopens"]
        idle = _switches(teller.native_id)
        time.sleep(0.5)
        assert _switches(teller.native_id) - idle <= 1
        with open(os.path.join(server.mountpoint, names[0]), "rb") as f:  # a reopen wakes it again
            assert sha(f.read()) == digests[names[0]]
        wait_until(lambda: ops.calls["reopened"] == 4 * len(names) + 1, 5, "the next reopen told")
    finally:
        assert server.stop(timeout=10)
    assert server.session.backing.open_ids == 0  # the session's end closed every backing id
    teller.join(5)
    assert not teller.is_alive() and server.session.backing.fast.table.wake == -1  # its eventfd closed


def _switches(tid: int) -> int:
    """Context switches of this process's thread ``tid`` so far (``/proc``, voluntary + not)."""
    with open(f"/proc/self/task/{tid}/status") as f:
        return sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)


@pytest.mark.parametrize("uring", [False, True], ids=["dev", "uring"])
def test_a_retired_reopen_keeps_its_backing_id_until_the_last_handle_opened_in_c_closes(tree, tmp_path, uring):
    """Retiring an inode (the dataset changed) stops the loops' opens of it at once, while the
    handles they opened stay readable; the table lets go of its backing id with the last of them
    (that RELEASE is Python's), and the next open lists the inode again."""
    root, digests = tree
    name = "mib+1.bin"
    with uring_enabled(uring):
        server, ops = serve(root, str(tmp_path / "mnt"), uring=uring, passthrough=True, reopen=True)
    backing = server.session.backing
    path = os.path.join(server.mountpoint, name)
    try:
        with open(path, "rb") as f:  # Python's OPEN: listed
            assert sha(f.read()) == digests[name]
        held = [open(path, "rb"), open(path, "rb")]  # answered in C
        assert ops.calls["open"] == 1 and backing.fast.opens == 2
        (ino, (backing_id, handles, retired)), = _listed(server).items()
        assert handles == 2 and not retired
        backing.retire_reopens()
        assert _listed(server) == {ino: (backing_id, 2, True)}
        third = open(path, "rb")  # no longer answered in C
        assert ops.calls["open"] == 2 and backing.fast.opens == 2
        for f in (*held, third):
            assert sha(f.read()) == digests[name]
        held[0].close()  # answered in C: one handle of the retired slot left
        wait_until(lambda: _listed(server) == {ino: (backing_id, 1, True)}, 5, "the first release")
        held[1].close()  # the last one: Python's, which lets go of the table's handle
        wait_until(lambda: not _listed(server), 5, "the retired slot freed")
        wait_until(lambda: ops.calls["reopened"] == 2, 5, "both reopens told")
        assert ino not in backing._listed and backing.held == 1  # `third` only
        third.close()
        wait_until(lambda: backing.held == 0, 5, "every handle released")
        with open(path, "rb") as f:  # Python's again (an idle backing id reused), listed again
            assert sha(f.read()) == digests[name]
        assert ops.calls["open"] == 3 and set(_listed(server)) == {ino}
        assert backing.registered == 1  # one BACKING_OPEN throughout
    finally:
        assert server.stop(timeout=10)


def test_an_unlinked_or_forgotten_file_is_no_longer_reopened_in_c(tmp_path):
    """A listed file unlinked since (the cache evicted it) is retired by the sweep, and one whose
    inode the kernel forgot (its entry invalidated) by its FORGET: its backing id goes."""
    root = tmp_path / "src"
    root.mkdir()
    for name in ("gone.bin", "kept.bin"):
        (root / name).write_bytes(name.encode() * 1000)
    mp = str(tmp_path / "mnt")
    server, ops = serve(str(root), mp, passthrough=True, reopen=True)
    backing = server.session.backing
    try:
        for name in ("gone.bin", "kept.bin") * 2:
            with open(os.path.join(mp, name), "rb") as f:
                assert f.read() == name.encode() * 1000
        assert ops.calls["open"] == 2 and backing.fast.opens == 2 and len(_listed(server)) == 2
        os.unlink(root / "gone.bin")
        assert backing.sweep() == 1
        assert len(_listed(server)) == 1 and len(backing._listed) == 1
        with open(os.path.join(mp, "kept.bin"), "rb") as f:
            assert f.read() == b"kept.bin" * 1000
        assert backing.fast.opens == 3
        # The kernel drops the entry, then the unused inode, with a FORGET (not drop_caches: that
        # would make other tests' mounts forget theirs too).
        server.session.notify_inval_entry(ROOT_ID, b"kept.bin")
        wait_until(lambda: not _listed(server) and not backing._listed, 10, "FORGET retiring the listed inode")
        wait_until(lambda: backing.open_ids == 0, 5, "every backing id closed")
    finally:
        assert server.stop(timeout=10)


@pytest.mark.parametrize("uring", [False, True], ids=["dev", "uring"])
def test_invalidation_after_the_tree_changes(tmp_path, uring):
    root = tmp_path / "src"
    (root / "inv").mkdir(parents=True)
    (root / "inv" / "f.txt").write_bytes(b"old")
    (root / "inv" / "g.txt").write_bytes(b"AAAA")
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    ops = MirrorOperations(str(root), timeout=60.0)
    server = FuseServer(ops, mp, passthrough=False, uring=uring)
    with uring_enabled(uring):
        server.start()
    try:
        assert bool(server.session.rings) == uring  # notifications still go through /dev/fuse
        f, g = os.path.join(mp, "inv", "f.txt"), os.path.join(mp, "inv", "g.txt")
        assert os.stat(f).st_size == 3 and open(g, "rb").read() == b"AAAA"
        # A new version of f.txt (a new file, a new inode) and new bytes in g.txt (same inode).
        (root / "inv" / "f.new").write_bytes(b"new version")
        os.replace(root / "inv" / "f.new", root / "inv" / "f.txt")
        with open(root / "inv" / "g.txt", "r+b") as out:
            out.write(b"BBBB")
        # The kernel still holds the old entry and pages (timeouts of 60 s, keep_cache).
        assert os.stat(f).st_size == 3 and open(g, "rb").read() == b"AAAA"
        parent = ops.ino_of("inv")
        assert server.session.notify_inval_entry(parent, b"f.txt") is True
        assert os.stat(f).st_size == 11 and open(f, "rb").read() == b"new version"
        assert server.session.notify_inval_inode(ops.ino_of("inv/g.txt")) is True
        assert open(g, "rb").read() == b"BBBB"
        assert server.session.notify_inval_entry(parent, b"never-looked-up") is False
    finally:
        assert server.stop(timeout=10)


def test_clean_unmount_ends_the_session(tree, tmp_path):
    root, digests = tree
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    server = FuseServer(MirrorOperations(root, passthrough=True), mp, fsname="datacache:test/tree", workers=3,
                        options=("noatime", "noexec"))
    session = server.start()
    try:
        fds = [session.fd, *session._fds]
        assert len(fds) == 3  # workers 2 and 3 read their own clone of the descriptor
        top = mountinfo.mounted_at(mp)
        assert (top.fstype, top.source) == ("fuse.datacache", "datacache:test/tree")
        flags = next(line.split()[5] for line in open("/proc/self/mountinfo") if line.split()[4] == mp)
        assert {"ro", "nosuid", "nodev", "noexec", "noatime"} <= set(flags.split(","))  # mount(2) flags
        assert sha_file(os.path.join(mp, "one.bin")) == digests["one.bin"]
    finally:
        assert server.stop(timeout=10)
    assert mountinfo.mounted_at(mp) is None
    assert session.alive_workers == 0
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)


def test_mount_through_fusermount3(tree, tmp_path):
    root, digests = tree
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    with FuseServer(MirrorOperations(root), mp, fsname="datacache:test/tree", method="fusermount",
                    passthrough=False) as server:
        assert server.mounted.how == "fusermount3"
        top = mountinfo.mounted_at(mp)
        assert (top.fstype, top.source) == ("fuse.datacache", "datacache:test/tree")
        assert sha_file(os.path.join(mp, "mib+1.bin")) == digests["mib+1.bin"]
    assert mountinfo.mounted_at(mp) is None


# -- requests a read-only mount never gets from the kernel -----------------------------------------
def test_requests_the_kernel_does_not_send_here():
    """Write requests, unknown opcodes, INTERRUPT and DESTROY, fed through a SOCK_SEQPACKET pair
    (message boundaries as on /dev/fuse): the VFS refuses writes on a read-only mount before the
    daemon sees them, so only this reaches those branches of the dispatch table."""
    from datacache_fuse.kernel import abi
    from datacache_fuse.kernel.session import Session

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    destroyed = []

    class Ops(MirrorOperations):
        def destroy(self):
            destroyed.append(True)

    def request(opcode: int, unique: int, body: bytes = b"") -> None:
        size = abi.IN_HEADER.size + len(body)
        theirs.send(abi.IN_HEADER.pack(size, opcode, unique, 1, 0, 0, 0, 0, 0) + body)

    def reply() -> tuple[int, int, bytes]:
        data = theirs.recv(1 << 16)
        length, error, unique = abi.OUT_HEADER.unpack_from(data)
        assert length == len(data)
        return unique, error, data[abi.OUT_HEADER.size:]

    session = Session(Ops(os.path.dirname(__file__)), ours.detach(), workers=1, passthrough=True)
    request(Op.INIT, 1, abi.INIT_IN.pack(7, 45, 1 << 17, 0x40000001 | 1 << 13, 1 << 5))  # flags2 bit 5: passthrough
    session.init()
    unique, error, body = reply()
    major, minor, readahead, flags = abi.INIT_OUT.unpack(body)[:4]
    assert (unique, error, major, minor, readahead) == (1, 0, 7, 45, 1 << 17)
    assert flags & 1 and not flags & (1 << 13)  # ASYNC_READ kept, READDIRPLUS not asked for
    assert abi.INIT_OUT.unpack(body)[10] == 1 << 5 and abi.INIT_OUT.unpack(body)[11] == 1  # passthrough, depth 1
    session.start()
    try:
        request(Op.MKDIR, 2, b"\0" * 8 + b"x\0")
        request(Op.WRITE, 3, b"\0" * 40)
        request(Op.INTERRUPT, 4, abi.INTERRUPT_IN.pack(3))  # no reply
        request(999, 5)
        request(Op.BMAP, 6, b"\0" * 16)
        request(Op.FORGET, 7, abi.FORGET_IN.pack(1))  # no reply
        request(Op.DESTROY, 8)
        answers = [reply() for _ in range(5)]
        assert [(u, -e) for u, e, _ in answers] == [(2, errno.EROFS), (3, errno.EROFS), (5, errno.ENOSYS),
                                                   (6, errno.ENOSYS), (8, 0)]
        assert session.wait(5) and destroyed == [True]
        counts = session.counts()
        assert counts[Op.INTERRUPT] == 1 and counts[999] == 1
    finally:
        theirs.close()
        session.close()


def test_a_users_mistake_in_a_handler_is_one_log_line_and_eio_a_bug_keeps_its_traceback(tree, tmp_path, caplog):
    """A read that needs a secret this shell lacks logged "failed unexpectedly" and a traceback;
    it is the user's to fix, so its one-line message is the log line. A bug keeps its traceback."""
    from datacache.errors import SecretNotFound

    class Failing(MirrorOperations):
        def read(self, ino, fh, offset, size):
            if offset == 0:
                raise SecretNotFound("dataset default/x: secret 's3' key 'access-key' not found: set DATACACHE_...")
            raise ValueError("a bug")

    root, _ = tree
    mp = str(tmp_path / "mnt")
    os.makedirs(mp)
    server = FuseServer(Failing(root), mp, fsname="datacache:test/failing")
    server.start()
    try:
        with caplog.at_level("WARNING", logger="datacache_fuse"):
            for offset in (0, 8192):
                with open(os.path.join(mp, "big.bin"), "rb", buffering=0) as f:
                    with pytest.raises(OSError) as err:
                        os.pread(f.fileno(), 4096, offset)
                    assert err.value.errno == errno.EIO
        said = [(r.levelname, r.getMessage(), r.exc_info is not None) for r in caplog.records]
        mistakes = [s for s in said if s[0] == "WARNING"]  # the kernel may retry a failed read once
        assert set(mistakes) == {("WARNING", "mnt: READ: EIO: dataset default/x: secret 's3' key 'access-key' "
                                             "not found: set DATACACHE_...", False)}, said
        assert [(level, message.endswith("READ failed unexpectedly; answering EIO"), tb)
                for level, message, tb in said[len(mistakes):]] == [("ERROR", True, True)], said
    finally:
        assert server.stop(timeout=10)

