"""Metadata sync as a stream: external merge sort of an unsorted listing, the diff beside the
manifest, progress, a failing listing, files shadowed by a directory of the same name, and real UFS
listings (local walk, S3 pages on moto)."""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from datacache.cli.data import _sync_progress
from datacache.control import sync
from datacache.stack.syncmark import MANIFEST_LOCK_FILE
from datacache.control.sync import DIFF_FILE, sync_manifest
from datacache.errors import ResourceError
from datacache.manifest import FileEntry, Manifest
from datacache.ufs import listing as ufs_listing
from support import apply_dataset, s3_mount


def entry(path: str, version: str = "v1", mount: str = "m") -> FileEntry:
    return FileEntry(path, mount, f"root/{path}", len(path), 2.0, version)


@pytest.fixture
def small_runs(monkeypatch):
    """Tiny chunks, runs and merge fan-in, so that a few thousand files take every path of the
    external sort: many runs, several merge passes."""
    monkeypatch.setattr(sync, "LIST_CHUNK", 64)
    monkeypatch.setattr(sync, "MERGE_ROWS", 50)
    monkeypatch.setattr(sync, "MERGE_FANIN", 3)


def test_unsorted_listing_is_sorted_deduplicated_and_diffed(tmp_path, small_runs):
    rng = random.Random(7)
    paths = [f"d{rng.randrange(30)}/f{i}" for i in range(5000)]
    listing = [entry(p) for p in paths if p != paths[10]]
    rng.shuffle(listing)
    listing.insert(100, entry(paths[10]))
    listing.insert(4000, entry(paths[10], "later", mount="second"))  # same path again: the later one wins
    progress: list[int] = []
    target = str(tmp_path / "manifest.parquet")

    diff = sync_manifest(iter(listing), target, progress.append, batch_rows=300)

    stored = Manifest.load(target)
    assert [e.path for e in stored] == sorted(paths)
    assert stored.lookup(paths[10]) == entry(paths[10], "later", mount="second")
    assert diff.duplicates == 1 and diff.duplicate_paths == (paths[10],)
    assert diff.counts == (5000, 0, 0) and diff.added == sorted(paths)
    assert progress == sorted(progress) and progress[-1] == 5001 and len(progress) == -(-5001 // 64)
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == [DIFF_FILE, MANIFEST_LOCK_FILE, "manifest.parquet"]  # temporary runs are gone

    # Second sync: 100 changed, 50 deleted, 25 added.
    gone, changed = set(paths[:50]), set(paths[50:150])
    relisted = [entry(p, "v2" if p in changed else "v1") for p in paths if p not in gone]
    relisted += [entry(f"new/{i}") for i in range(25)]
    rng.shuffle(relisted)
    diff = sync_manifest(iter(relisted), target, batch_rows=300)
    assert diff.added == sorted(f"new/{i}" for i in range(25))
    assert diff.changed == sorted(changed)
    assert diff.deleted == sorted(gone)
    on_disk = pq.read_table(tmp_path / DIFF_FILE).to_pylist()
    assert sorted((r["change"], r["path"]) for r in on_disk) == sorted(
        [("added", p) for p in diff.added] + [("changed", p) for p in diff.changed]
        + [("deleted", p) for p in diff.deleted])


def test_a_file_shadowed_by_a_directory_of_the_same_name_is_left_out(tmp_path, small_runs):
    """Object keys ``x`` and ``x/z``: a directory and a file cannot share a name, the directory
    wins (Mountpoint for Amazon S3's rule); the hidden files are counted and named in the diff."""
    rng = random.Random(3)
    shadowed = ["a", "x", "x/z"]
    visible = ["x-y", "x.txt", "x/z/w", "x/zz", "a/b", "ab", "top"] + [f"d{i % 9}/f{i}" for i in range(700)]
    listing = [entry(p) for p in shadowed + visible]
    rng.shuffle(listing)
    target = str(tmp_path / "manifest.parquet")

    diff = sync_manifest(iter(listing), target, batch_rows=100)

    stored = Manifest.load(target)
    assert os.stat(target).st_mode & 0o777 == 0o600  # rewritten without the shadowed rows, still private
    assert [e.path for e in stored] == sorted(visible)
    assert diff.counts == (len(visible), 0, 0) and diff.shadowed == 3 and diff.shadowed_paths == ("a", "x", "x/z")
    assert stored.lookup("x") is None and stored.is_dir("x") and stored.listdir("")["x"] is None
    assert sorted(stored.listdir("x")) == ["z", "zz"] and stored.listdir("x")["z"] is None
    assert [e.path for e in stored.select("x")] == ["x/z/w", "x/zz"]
    # The directory goes away: the file it hid is listed again, as an addition.
    diff = sync_manifest(iter([entry(p) for p in shadowed + visible if not p.startswith("x/")]), target)
    assert diff.shadowed == 1 and diff.added == ["x"] and diff.deleted == ["x/z/w", "x/zz"]
    assert Manifest.load(target).lookup("x") == entry("x")


def test_a_failing_listing_leaves_the_stored_manifest(tmp_path):
    target = str(tmp_path / "manifest.parquet")
    sync_manifest(iter([entry("a"), entry("b")]), target)
    before = open(target, "rb").read()

    def broken():
        yield entry("a")
        raise ResourceError("dataset 'x': spec.mounts[0] ('m'): cannot list the mountPoint: boom")

    with pytest.raises(ResourceError, match="cannot list the mountPoint: boom"):
        sync_manifest(broken(), target)
    assert open(target, "rb").read() == before
    assert sorted(os.listdir(tmp_path)) == [DIFF_FILE, MANIFEST_LOCK_FILE, "manifest.parquet"]


def test_empty_listing_gives_an_empty_manifest(tmp_path):
    target = str(tmp_path / "manifest.parquet")
    sync_manifest(iter([entry("a")]), target)
    diff = sync_manifest(iter([]), target)
    assert diff.deleted == ["a"] and Manifest.load(target).file_num == 0


def test_local_walk_lists_every_file_with_its_version(datacache_home, tmp_path):
    root = tmp_path / "src"
    names = ["q?mark.txt", "per%cent.txt", "a space.txt", "é-accent.txt", "中文/文件.txt", "-dash.txt",
             "a-b/x", "a/b/c", "a/b0"]
    for i, name in enumerate(names):
        (root / os.path.dirname(name)).mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * i)
    plane = apply_dataset(datacache_home, "loc", [{"name": "l", "mountPoint": str(root)}])
    manifest = plane.load_manifest(plane.get("Dataset", "loc"))
    assert [e.path for e in manifest] == sorted(names)
    for e in manifest:
        st = os.stat(root / e.path)
        assert (e.size, e.ufs_path, e.version) == (st.st_size, f"{root}/{e.path}",
                                                   f"{st.st_mtime!r}:{st.st_size}:{st.st_ino}:{st.st_ctime!r}")
    os.remove(root / "a/b/c")
    (root / "a/b0").write_bytes(b"longer now")
    (root / "new.txt").write_bytes(b"n")
    diff = plane.sync("loc")
    assert (diff.added, diff.changed, diff.deleted) == (["new.txt"], ["a/b0"], ["a/b/c"])


def test_missing_local_root_is_a_clear_error(datacache_home, tmp_path):
    with pytest.raises(ResourceError, match=r"spec.mounts\[0\] \('l'\): mountPoint '.*/absent' does not exist in "
                                            r"the UFS: fix the mountPoint or create it"):
        apply_dataset(datacache_home, "loc", [{"name": "l", "mountPoint": str(tmp_path / "absent")}])


def test_s3_listing_is_paged_and_in_key_order(datacache_home, s3_bucket, moto_server, moto_secrets, monkeypatch):
    monkeypatch.setattr(ufs_listing, "_S3_PAGE", 7)  # keys taken from s3fs per event-loop round trip
    fs, bucket = s3_bucket
    keys = [f"p/{i % 7}/k{i:05d}" for i in range(1003)]  # two ListObjectsV2 pages (1000 keys each)
    fs.pipe({f"{bucket}/{k}": k.encode() for k in keys})
    fs.pipe({f"{bucket}/p/marker/": b"", f"{bucket}/q/outside": b"x", f"{bucket}/p0": b"y"})
    plane = apply_dataset(datacache_home, "pages", [s3_mount(moto_server, bucket, prefix="p")])
    manifest = plane.load_manifest(plane.get("Dataset", "pages"))
    assert [e.path for e in manifest] == sorted(k[2:] for k in keys)
    e = manifest.lookup("3/k00003")
    assert (e.size, e.ufs_path) == (len("p/3/k00003"), f"{bucket}/p/3/k00003")
    assert e.version == fs.info(f"{bucket}/p/3/k00003")["ETag"]


def test_an_s3_key_shadowed_by_a_prefix_is_reported_by_datacache_sync(datacache_home, s3_bucket, moto_server,
                                                                     moto_secrets, caplog):
    fs, bucket = s3_bucket
    fs.pipe({f"{bucket}/sh/a": b"hidden", f"{bucket}/sh/a/b": b"inside", f"{bucket}/sh/c": b"plain"})
    plane = apply_dataset(datacache_home, "shadow", [s3_mount(moto_server, bucket, prefix="sh", path="/s3")])
    message = ("dataset default/shadow: 1 file hidden by a directory of the same name (the directory wins, as in "
               "Mountpoint for Amazon S3): s3/a; rename the object in the UFS to read it")
    caplog.clear()  # applying it synced once already
    with caplog.at_level(logging.WARNING, logger="datacache"):
        diff = plane.sync("shadow")
    assert diff.shadowed == 1 and diff.shadowed_paths == ("s3/a",) and caplog.messages == [message]
    proc = subprocess.run([sys.executable, "-m", "datacache", "sync", "shadow"], capture_output=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(datacache_home)})
    assert proc.returncode == 0 and proc.stderr.decode().strip() == message, proc.stderr.decode()
    client = plane.open_dataset("shadow")
    try:
        assert client.stat("s3/a") is None and client.listdir("s3") == {"a": None, "c": client.stat("s3/c")}
        assert client.read(client.stat("s3/a/b"), 0, 100) == b"inside"
    finally:
        client.close()
    assert plane.get("Dataset", "shadow").status.file_num == 2


def test_s3_keys_that_normalise_to_one_path_keep_the_last_and_are_reported(datacache_home, s3_bucket, moto_server,
                                                                           moto_secrets, caplog):
    fs, bucket = s3_bucket
    for key, body in (("nm/e//f", b"double slash"), ("nm/e/f", b"single slash"), ("nm/g", b"plain")):
        fs.call_s3("put_object", Bucket=bucket, Key=key, Body=body)
    plane = apply_dataset(datacache_home, "norm", [s3_mount(moto_server, bucket, prefix="nm", path="/s3")])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="datacache"):
        diff = plane.sync("norm")
    assert diff.duplicates == 1 and diff.duplicate_paths == ("s3/e/f",)
    assert caplog.messages == [
        "dataset default/norm: 1 file hidden by another whose name normalises to the same dataset path (object "
        "keys like a//b and a/b; the one listed last is kept): s3/e/f"]
    client = plane.open_dataset("norm")
    try:
        entry = client.stat("s3/e/f")
        assert client.read(entry, 0, 100) == b"single slash"  # S3 lists keys in order: nm/e/f comes last
    finally:
        client.close()
    assert plane.get("Dataset", "norm").status.file_num == 2


def test_missing_s3_prefix_is_a_clear_error(datacache_home, s3_bucket, moto_server, moto_secrets):
    fs, bucket = s3_bucket
    fs.pipe(f"{bucket}/other/x", b"x")
    with pytest.raises(ResourceError, match=rf"mountPoint 's3://{bucket}/absent' does not exist in the UFS"):
        apply_dataset(datacache_home, "nope", [s3_mount(moto_server, bucket, prefix="absent")])


def test_cli_progress_lines_go_to_stderr(capsys, monkeypatch):
    report = _sync_progress("big", every_s=0)
    report(8192)
    report(16384)
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.splitlines() == ["dataset.datacache.io/big: 8192 files listed",
                                    "dataset.datacache.io/big: 16384 files listed"]
    quiet = _sync_progress("small", every_s=3600)  # a sync shorter than the interval prints nothing
    quiet(5)
    assert capsys.readouterr().err == ""


def test_local_rewrite_keeping_size_and_mtime_is_a_new_version(tmp_path, datacache_home):
    """cp --preserve=timestamps onto an existing file (or any rewrite that restores the mtime):
    same size, same mtime, same inode; only ctime tells (case C3 for local sources)."""
    import subprocess

    root = tmp_path / "src"
    root.mkdir()
    old, new = os.urandom(3 << 20), os.urandom(3 << 20)
    for name, data in (("f.bin", old), ("new.bin", new)):
        (root / name).write_bytes(data)
        os.utime(root / name, (315532800, 315532800))
    plane = apply_dataset(datacache_home, "cp", [{"name": "l", "mountPoint": str(root)}])
    client = plane.open_dataset("cp")
    try:
        assert client.open("f.bin").read(1 << 20) == old[:1 << 20]  # the first block cached
        ino = os.stat(root / "f.bin").st_ino
        subprocess.run(["cp", "--preserve=timestamps", str(root / "new.bin"), str(root / "f.bin")], check=True)
        st = os.stat(root / "f.bin")
        assert (st.st_ino, st.st_size, st.st_mtime) == (ino, len(old), 315532800)
        diff = plane.sync("cp")
        assert diff.changed == ["f.bin"]
    finally:
        client.close()
    client = plane.open_dataset("cp")
    try:
        assert client.open("f.bin").read() == new
    finally:
        client.close()


def _random_tree(rng: random.Random, n: int) -> tuple[set[str], set[str]]:
    """``(files, directory rows)`` of a random namespace over few names (so prefixes clash: 'a',
    'a-b', 'a/b'); every directory of a walk is a row, as the local listing gives them."""
    names = ["a", "a-b", "b", "a0", "c"]
    files: set[str] = set()
    dirs: set[str] = set()
    for _ in range(n):
        parts = [rng.choice(names) for _ in range(rng.randint(1, 4))]
        path = "/".join(parts)
        if rng.random() < 0.3:
            dirs.add(path)
        else:
            files.add(path)
    dirs |= {"/".join(p.split("/")[:i]) for p in files | dirs for i in range(1, p.count("/") + 1)}
    files -= dirs  # no file named as a directory here (the shadowing test covers that)
    return files, dirs


def _shown_rows(files: set[str], dirs: set[str]) -> set[str]:
    """The rows a manifest keeps: the files, and a row 'd/' for each directory with nothing below it."""
    return files | {d + "/" for d in dirs if not any(p.startswith(d + "/") for p in files | dirs)}


@pytest.mark.parametrize("seed", range(6))
def test_directory_rows_through_the_external_sort_and_the_diff(tmp_path, small_runs, monkeypatch, seed):
    """Directory rows sort and merge as any row; only directories with nothing below them are kept;
    a diff names a directory only when it appeared or vanished, not when it got or lost files
    (read in batches of a few rows, so whether a path lies below a directory is often only known
    a batch later)."""
    rng = random.Random(seed)
    monkeypatch.setattr(sync, "BATCH_ROWS", 5 + seed)
    target = str(tmp_path / "manifest.parquet")
    old_files, old_dirs = _random_tree(rng, 300)
    new_files, new_dirs = _random_tree(rng, 300)
    states = []
    for files, dirs in ((old_files, old_dirs), (new_files, new_dirs)):
        listing = [entry(p) for p in files] + [FileEntry(d + "/", "m", f"root/{d}", 0, 0.0, "") for d in dirs]
        rng.shuffle(listing)
        diff = sync_manifest(iter(listing), target, batch_rows=rng.choice([7, 50, 300]))
        stored = Manifest.load(target)
        rows = _shown_rows(files, dirs)
        assert [e.path for e in stored] == sorted(files) and stored.file_num == len(files)
        assert stored.dir_rows.column("path").to_pylist() == sorted(r for r in rows if r.endswith("/"))
        for d in dirs:
            assert stored.is_dir(d) and sorted(stored.listdir(d)) == sorted(
                {p[len(d) + 1:].split("/")[0] for p in files | dirs if p.startswith(d + "/")})
        states.append((rows, stored))
    (old_rows, old), (new_rows, new) = states

    def below(d: str, rows: set[str]) -> bool:
        return any(r.startswith(d) for r in rows)

    expected_added = sorted(r for r in new_rows - old_rows if not (r.endswith("/") and below(r, old_rows)))
    expected_deleted = sorted(r for r in old_rows - new_rows if not (r.endswith("/") and below(r, new_rows)))
    assert (diff.added, diff.changed, diff.deleted) == (expected_added, [], expected_deleted)
    assert old.diff(new) == diff.__class__(expected_added, [], expected_deleted)
