"""The manifest's sorted-path index and streaming diff, checked against a plain-Python reference
over names that sort awkwardly (C7 characters, 'a-b' before 'a/', a file next to a directory of
the same stem) and tables of many small chunks (every search crosses chunk boundaries)."""

from __future__ import annotations

import fnmatch
import os
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datacache.manifest import FileEntry, Manifest, ManifestDiff, _PathIndex, diff_batches, entries_table

PATHS = ["a", "a-b/x", "a/b/c.txt", "a/b/d.txt", "a/b0", "a/c", "a.b", "b/q?mark.txt", "b/per%cent.txt",
         "b/hash#tag.txt", "b/plus+sign.txt", "b/a space.txt", "b/é-accent.txt", "中文/文件.txt",
         "-leading-dash.txt", "z/" + "y/" * 20 + "deep.bin"] + [f"many/f{i:04d}" for i in range(300)]


def entry(path: str, version: str = "v1") -> FileEntry:
    return FileEntry(path, "m", f"bucket/{path}", len(path) * 7, 1.5, version)


def chunked(entries: list[FileEntry], rows: int = 7) -> Manifest:
    """A manifest whose table has chunks of ``rows`` rows, in shuffled order (it must sort)."""
    entries = entries[:]
    random.Random(1).shuffle(entries)
    tables = [entries_table(entries[i:i + rows]) for i in range(0, len(entries), rows)]
    return Manifest(pa.concat_tables(tables))


def reference_listdir(paths: list[str], d: str) -> dict[str, bool]:
    """name -> is a file, from the paths alone."""
    prefix = f"{d}/" if d else ""
    out: dict[str, bool] = {}
    for p in sorted(paths):
        if p.startswith(prefix):
            name, sep, _ = p[len(prefix):].partition("/")
            out.setdefault(name, not sep)
    return out


def all_dirs(paths: list[str]) -> set[str]:
    dirs = {""}
    for p in paths:
        parts = p.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
    return dirs


def test_lookup_is_dir_listdir_match_the_reference():
    m = chunked([entry(p) for p in PATHS])
    assert [e.path for e in m] == sorted(PATHS)  # iteration in path order
    assert m.file_num == len(PATHS) and m.total_size == sum(len(p) * 7 for p in PATHS)
    ordered = sorted(PATHS)
    for p in PATHS:
        assert m.lookup(p) == entry(p)
        assert m.lookup("/" + p + "/") == entry(p)  # normalised
        assert m.position(p) == m.position("/" + p) == ordered.index(p)  # its row in path order
        assert not m.is_dir(p) or p == "a"
    for lo, hi in ((0, 1), (5, 19), (300, len(PATHS)), (3, 3), (len(PATHS) - 2, len(PATHS) + 5)):  # chunks of 7
        assert list(m.rows(lo, hi)) == [entry(p) for p in ordered[lo:hi]]
    for d in all_dirs(PATHS):
        assert m.is_dir(d)
        got = m.listdir(d)
        assert {k: v is not None for k, v in got.items()} == reference_listdir(PATHS, d)
        assert all(v == entry(f"{d}/{k}".lstrip("/")) for k, v in got.items() if v is not None)
    for missing in ("nope", "a/b/c", "a/b/c.txt/x", "a-", "many/f0300", "z/y/deep.bin"):
        assert m.lookup(missing) is None and m.position(missing) is None
        assert not m.is_dir(missing)
        with pytest.raises(FileNotFoundError):
            m.listdir(missing)
    with pytest.raises(NotADirectoryError):
        m.listdir("a/b/c.txt")
    assert m.lookup("") is None and m.position("") is None and m.position("a/b") is None and m.is_dir("")
    with pytest.raises(ValueError, match="'..' is not allowed"):
        m.lookup("a/../b")


def test_tree_sizes_and_samples_match_the_reference():
    m = chunked([entry(p) for p in PATHS] + [FileEntry("a/b/empty", "m", "bucket/e", 0, 1.0, "v1")])
    for d in all_dirs(PATHS) | {"/a/", "nope", "a/b/c.txt"}:
        below = [p for p in PATHS if p.startswith(d.strip("/") + "/") or not d]
        assert m.tree_size(d) == (len(below), sum(len(p) * 7 for p in below))  # the empty file not counted
    random.seed(4)
    picked = m.sample("a", 4)
    assert len(picked) <= 4 and len({e.path for e in picked}) == len(picked)
    assert all(e == entry(e.path) and e.path.startswith("a/") for e in picked)  # never the empty file
    assert sorted(e.path for e in m.sample("many", 1000)) == sorted(p for p in PATHS if p.startswith("many/"))
    assert m.sample("nope", 5) == [] and m.tree_size("") == (len(PATHS), m.total_size)


def test_repeated_lookups_answer_the_same_and_stay_bounded(monkeypatch):
    import datacache.manifest as manifest_module

    monkeypatch.setattr(manifest_module, "_FOUND_ENTRIES", 8)
    m = chunked([entry(p) for p in PATHS])
    for _ in range(3):  # the first pass searches, later ones may be remembered: the same answers
        for p in PATHS:
            assert m.lookup(p) == entry(p) and len(m._found) <= 8
        assert m.lookup("nope") is None and m.lookup("a/b") is None  # misses and directories: never kept
    assert len(PATHS) > 8 and "nope" not in m._found and m._whole is None  # too large to decode whole


def test_a_small_manifest_is_decoded_whole_once_a_sixteenth_of_it_was_searched_and_answers_the_same(monkeypatch):
    import datacache.manifest as manifest_module

    asked = PATHS + ["nope", "a/b", "a/b/c", "many", "many/f0300", "", "a-"]
    monkeypatch.setattr(manifest_module, "_WHOLE_AFTER", 0)  # after file_num / 0 searches: never, every miss searched
    searched = chunked([entry(p) for p in PATHS])
    reference = [(searched.lookup(p), searched.position(p)) for p in asked]
    assert searched._whole is None and reference[0][0] == entry(PATHS[0])
    monkeypatch.setattr(manifest_module, "_WHOLE_AFTER", 16)
    m = chunked([entry(p) for p in PATHS])
    firsts = -(-len(PATHS) // 16)  # searches before it is decoded whole
    assert [(m.lookup(p), m.position(p)) for p in PATHS[:firsts - 1]] == reference[:firsts - 1]
    assert m._whole is None
    assert [(m.lookup(p), m.position(p)) for p in asked] == reference
    assert len(m._whole) == len(PATHS) and m._found == {}


def test_a_large_manifest_builds_its_path_index_after_enough_searches_and_answers_as_the_search(monkeypatch):
    """Past _FOUND_ENTRIES files (here 8) no whole decode: after file_num / _INDEX_AFTER searches a
    hash index answers, the same rows and entries as the binary search, also where paths' hashes
    collide (a hash of four values: every bucket holds ~100 paths)."""
    import datacache.manifest as manifest_module

    asked = PATHS + ["nope", "a/b", "a/b/c", "many", "many/f0300", "", "a-", "中文", "中文/文件.tx"]
    monkeypatch.setattr(manifest_module, "_FOUND_ENTRIES", 8)
    monkeypatch.setattr(manifest_module, "_INDEX_AFTER", 0)  # after file_num / 0 searches: never
    searched = chunked([entry(p) for p in PATHS])
    reference = [(searched.lookup(p), searched.position(p)) for p in asked]
    assert searched._index is None and searched._whole is None and reference[0] == (entry(PATHS[0]), 1)
    monkeypatch.setattr(manifest_module, "_INDEX_AFTER", 32)
    for colliding in (False, True):
        if colliding:
            monkeypatch.setattr(manifest_module, "xxh3_64_intdigest", lambda data: len(data) % 4)
        m = chunked([entry(p) for p in PATHS])
        firsts = -(-len(PATHS) // 32)  # searches before the index is built
        assert [(m.lookup(p), m.position(p)) for p in PATHS[:firsts - 1]] == reference[:firsts - 1]
        assert m._index is None
        for _ in range(2):  # the second pass partly from the bounded _found
            assert [(m.lookup(p), m.position(p)) for p in asked] == reference
        assert m._index is not None and m._whole is None and len(m._found) <= 8


@pytest.mark.parametrize("found_entries", [8, 16384])  # answered by the path index, by the whole decode
def test_the_root_and_names_that_are_not_utf8_are_no_file_however_the_manifest_is_looked_up(monkeypatch,
                                                                                            found_entries):
    """A sync keeps a file row of path "" (a UFS key ``ROOT/.``): the root stays a directory, before
    and after the index or the whole decode. A name FUSE decoded from bytes that are not UTF-8
    (``os.fsdecode``: surrogates) is no file and no directory, not an error (FUSE's EIO)."""
    import datacache.manifest as manifest_module

    monkeypatch.setattr(manifest_module, "_FOUND_ENTRIES", found_entries)
    m = chunked([entry(p) for p in PATHS] + [FileEntry("", "m", "bucket/.", 5, 1.0, "v1")])
    strange = os.fsdecode(b"many/f\xff0001")
    for _ in range(len(PATHS)):
        assert m.lookup("") is None and m.position("") is None and m.is_dir("")
        assert m.lookup(strange) is None and m.lookup("many/f0001") == entry("many/f0001")
    assert not m.is_dir(strange) and m.select(strange) == []
    with pytest.raises(FileNotFoundError):
        m.listdir(strange)
    assert (m._index is not None) == (found_entries == 8) and (m._whole is not None) == (found_entries == 16384)


def test_row_values_read_from_buffers_equal_arrow_s_own_for_slices_nulls_and_empty_arrays():
    """_values reads strings, int64 and float64 from the array's buffers: arrays that are slices
    (an offset into shared buffers, as a mapped copy's batches are), arrays with nulls (read
    through Arrow), empty strings and arrays of no characters at all."""
    from datacache.manifest import _values

    arrays = [pa.array(["", "é-accent", "中文/文件.txt", "a" * 300, ""]),
              pa.array([0, -1, 2 ** 62, 7, 1 << 40], pa.int64()),
              pa.array([0.0, -1.5, 1e300, float("inf"), 2.25], pa.float64()),
              pa.array(["x", None, "y", "z", None]), pa.array([1, None, 3, 4, 5], pa.int64()),
              pa.array(["", "", "", "", ""]), pa.array([], pa.string()), pa.array([True, False, True, None, True])]
    for array in arrays:
        for part in (array, array.slice(1), array.slice(2, 2), array.slice(len(array))):
            values = _values(part)
            assert [values(i) for i in range(len(part))] == part.to_pylist()
    ordered = sorted(PATHS)[:15]
    table = pa.concat_tables([entries_table([entry(p) for p in ordered[i:i + 5]]) for i in (0, 5, 10)])
    m = Manifest(table.slice(2, 11), table.slice(0, 0))  # sorted batches with offsets, as a mapped copy's
    assert [b.column(0).offset for b in m.table.to_batches()] == [2, 0, 0]
    assert [m.lookup(p) for p in ordered] == [None] * 2 + [entry(p) for p in ordered[2:13]] + [None] * 2
    assert list(m.rows(0, 11)) == [entry(p) for p in ordered[2:13]]


def test_listdir_of_a_directory_of_100000_entries_is_complete_and_cached():
    """C12: a FUSE directory of 100,000 entries lists (FUSE's opendir asks the manifest)."""
    m = chunked([entry(f"big/{i:06d}") for i in range(100_000)] + [entry("big/sub/x"), entry("c")], rows=65536)
    children = m.listdir("big")
    assert len(children) == 100_001 and children["sub"] is None and children["000123"] == entry("big/000123")
    assert sorted(children)[:2] == ["000000", "000001"] and m.listdir("") == {"big": None, "c": entry("c")}
    assert m.listdir("big/") is children  # served from the LRU cache


def test_select_files_directories_and_globs():
    m = chunked([entry(p) for p in PATHS])
    assert [e.path for e in m.select("a/b")] == ["a/b/c.txt", "a/b/d.txt"]
    assert [e.path for e in m.select("a/b/c.txt")] == ["a/b/c.txt"]
    assert [e.path for e in m.select("/")] == sorted(PATHS)
    for glob in ("a/*", "b/*.txt", "many/f00[0-2]?", "*.txt", "*/q?mark.txt", "a?b*"):
        assert [e.path for e in m.select(glob)] == sorted(p for p in PATHS if fnmatch.fnmatchcase(p, glob))
    assert m.select("nothing/here") == [] and m.select("nothing*") == []


def test_with_entry_splices_without_resorting():
    m = chunked([entry(p) for p in PATHS])
    changed = m.with_entry(entry("a/b/c.txt", "v2"), "a/b/c.txt")
    assert changed.lookup("a/b/c.txt").version == "v2" and changed.file_num == m.file_num
    gone = m.with_entry(None, "many/f0007")
    assert gone.lookup("many/f0007") is None and gone.file_num == m.file_num - 1
    assert [e.path for e in gone] == sorted(p for p in PATHS if p != "many/f0007")
    assert m.lookup("many/f0007") is not None  # the original is unchanged


def test_save_load_roundtrip_mode_0600(tmp_path):
    m = chunked([entry(p) for p in PATHS])
    path = str(tmp_path / "manifest.parquet")
    m.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    loaded = Manifest.load(path)
    assert loaded.table.equals(m.table) and list(loaded) == list(m)


def random_versions(rng: random.Random, n: int) -> dict[str, str]:
    return {f"d{rng.randrange(40):02d}/{rng.randrange(10 ** 6):06d}": str(rng.randrange(3)) for _ in range(n)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streaming_diff_matches_set_arithmetic(seed):
    rng = random.Random(seed)
    old, new = random_versions(rng, 3000), random_versions(rng, 100)
    new.update({p: (v if rng.random() < 0.7 else v + "x") for p, v in old.items() if rng.random() < 0.8})

    def batches(versions: dict[str, str], rows: int):  # uneven batch sizes on the two sides
        table = pa.table({"path": sorted(versions), "version": [versions[p] for p in sorted(versions)]})
        return table.to_batches(max_chunksize=rows)

    diff = diff_batches(batches(old, 97), batches(new, 211))
    assert diff.added == sorted(set(new) - set(old))
    assert diff.deleted == sorted(set(old) - set(new))
    assert diff.changed == sorted(p for p in set(old) & set(new) if old[p] != new[p])
    assert diff.counts == (len(diff.added), len(diff.changed), len(diff.deleted)) and not diff.truncated
    # Manifest.diff is the same merge.
    to_manifest = lambda d: Manifest.from_entries(entry(p, v) for p, v in d.items())  # noqa: E731
    assert to_manifest(old).diff(to_manifest(new)) == diff


def test_diff_to_a_file_keeps_only_the_first_paths_in_memory(tmp_path):
    old = pa.table({"path": [f"f{i:05d}" for i in range(0, 20000, 2)], "version": ["1"] * 10000})
    new = pa.table({"path": [f"f{i:05d}" for i in range(10000)], "version": ["2"] * 10000})
    out = str(tmp_path / "diff.parquet")
    diff = diff_batches(old.to_batches(1000), new.to_batches(3000), out=out, limit=100)
    assert diff.counts == (5000, 5000, 5000) and diff.truncated and not diff.empty
    assert diff.added == [f"f{i:05d}" for i in range(1, 200, 2)]
    assert list(diff.paths("added")) == [f"f{i:05d}" for i in range(1, 10000, 2)]
    assert list(diff.paths("changed")) == [f"f{i:05d}" for i in range(0, 10000, 2)]
    assert list(diff.paths("deleted")) == [f"f{i:05d}" for i in range(10000, 20000, 2)]
    assert os.stat(out).st_mode & 0o777 == 0o600
    assert pq.read_table(out).num_rows == 15000
    with pytest.raises(ValueError, match="unknown change 'moved'"):
        list(diff.paths("moved"))


def test_a_diff_built_by_hand_still_works():
    diff = ManifestDiff(added=["x"], changed=[], deleted=[])
    assert diff.counts == (1, 0, 0) and not diff.truncated and list(diff.paths("added")) == ["x"]
    assert ManifestDiff([], [], []).empty


def test_directory_rows_survive_save_and_a_refresh_splice(tmp_path):
    """Rows of directories with nothing below them ('e/') are kept apart from the files, saved
    sorted among them, and dropped by a splice that puts a file below them."""
    dir_row = FileEntry("e/", "m", "bucket/e/", 0, 0.0, "")
    m = chunked([entry(p) for p in PATHS] + [dir_row, FileEntry("a-b/z/", "m", "bucket/a-b/z/", 0, 0.0, "")])
    assert m.file_num == len(PATHS) and [e.path for e in m] == sorted(PATHS)
    assert m.dir_rows.column("path").to_pylist() == ["a-b/z/", "e/"]
    assert m.is_dir("e") and m.listdir("e") == {} and m.listdir("")["e"] is None
    assert sorted(m.listdir("a-b")) == ["x", "z"] and m.listdir("a-b")["z"] is None
    path = str(tmp_path / "manifest.parquet")
    m.save(path)
    stored = pq.read_table(path).column("path").to_pylist()
    assert stored == sorted(stored) and "e/" in stored
    loaded = Manifest.load(path)
    assert loaded.equals(m) and not loaded.equals(chunked([entry(p) for p in PATHS]))
    spliced = loaded.with_entry(entry("e/new.txt"), "e/new.txt")
    assert spliced.dir_rows.column("path").to_pylist() == ["a-b/z/"]
    assert list(spliced.listdir("e")) == ["new.txt"]
    assert loaded.diff(spliced) == ManifestDiff(["e/new.txt"], [], [])  # the directory was there already
    gone = loaded.with_entry(None, "a")
    assert gone.dir_rows.equals(loaded.dir_rows) and gone.lookup("a") is None


@pytest.fixture
def mapped(tmp_path, monkeypatch):
    """A manifest of PATHS and one directory row, saved where loads of 100 rows and more get a
    mapped copy: ``(manifest, its path, the copy's path)``."""
    import datacache.manifest as manifest_module

    monkeypatch.setattr(manifest_module, "MAPPED_ROWS", 100)
    m = chunked([entry(p) for p in PATHS] + [FileEntry("e/", "m", "bucket/e/", 0, 0.0, "")])
    path = str(tmp_path / "manifest.parquet")
    m.save(path)
    return m, path, path + manifest_module.MAPPED_SUFFIX


def same(loaded: Manifest, m: Manifest) -> None:
    assert loaded.equals(m) and loaded.dir_rows.column("path").to_pylist() == ["e/"]
    assert [loaded.lookup(p) for p in PATHS] == [m.lookup(p) for p in PATHS]
    assert loaded.position("many/f0003") == sorted(PATHS).index("many/f0003")
    assert loaded.listdir("") == m.listdir("") and loaded.listdir("e") == {}


def test_a_large_manifest_is_mapped_from_its_copy_by_later_loads(mapped, caplog):
    """The first load writes the copy (0600) a batch of rows at a time and maps it, as later loads
    do (no Arrow memory kept), with the path index its writer built, which their look-ups use from
    the first. A new manifest of the same size and inode, saved in the same clock tick, is not
    served by the copy of the old one (its tag is the Parquet bytes' checksum, not the file's
    identity)."""
    m, path, copy = mapped
    for _ in range(2):  # the first load (the copy written), then a later one
        before = pa.total_allocated_bytes()
        loaded = Manifest.load(path)
        assert pa.total_allocated_bytes() - before < 4096  # views of the mapping, nothing decoded kept
        assert loaded._index is not None and loaded._index.batch.equals(_PathIndex.build(m._chunks).batch)
        same(loaded, m)
        assert loaded._searches == 0  # every look-up went through the index
        assert loaded.lookup("a/nope") is None and loaded.lookup("many") is None and loaded.lookup("e/") is None
        assert os.stat(copy).st_mode & 0o777 == 0o600 and not os.path.exists(copy + ".tmp")
    st = os.stat(path)
    for size in sorted({len(p) * 7 for p in PATHS} - {len("a/c") * 7}):  # another manifest, its file as large
        changed = m.with_entry(FileEntry("a/c", "m", "bucket/a/c", size, 1.5, "v1"), "a/c")
        if os.path.getsize(_saved(changed, path + ".new")) == st.st_size:
            break
    with open(path, "r+b") as f:  # rewritten in place: the same inode; the times put back
        f.write(open(path + ".new", "rb").read())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(path)
    assert (now.st_dev, now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    assert Manifest.load(path).lookup("a/c").size == size
    assert Manifest.load(path).equals(changed)  # from the copy written anew
    assert "not used" not in caplog.text  # a stale copy is no damage


def _saved(m: Manifest, path: str) -> str:
    m.save(path)
    return path


@pytest.mark.parametrize("damage", ["footer", "row", "index", "files", "trailer", "empty", "older"])
def test_a_damaged_copy_is_not_used_and_is_written_anew(mapped, caplog, damage):
    """Any damage (its index's Arrow footer, a path inside its rows changed to another valid one, a
    hash of its index, its count of file rows, its trailer, an empty file) or a copy of the format
    before the index: the load reads the Parquet file, answers the same, and writes the copy anew."""
    import logging

    m, path, copy = mapped
    Manifest.load(path)
    data = bytearray(open(copy, "rb").read())
    trailer = len(data) - 64  # source digest, files, rows' end, index offset, checksum, magic
    rows_end, index_at = (int.from_bytes(data[trailer + at:trailer + at + 8], "little") for at in (24, 32))
    assert index_at % 64 == 0 and 0 <= index_at - rows_end < 64  # the index's buffers aligned
    if damage == "footer":
        data[trailer - 16:trailer] = b"not an arrow end"
    elif damage == "row":  # 'many/f0001' -> 'many/f0009': still sorted, still UTF-8, another file
        at = data.index(b"many/f0001")
        data[at + 9:at + 10] = b"9"
    elif damage == "index":  # the first hash of the index's one batch, one bit flipped
        h = min(_PathIndex.build([pa.array(PATHS)])._hashes).to_bytes(8, "little")
        at = data.index(h, index_at)
        data[at] ^= 1
    elif damage == "files":
        data[trailer + 16:trailer + 24] = (10 ** 6).to_bytes(8, "little")
    elif damage == "trailer":
        data[-8:] = b"XXXXXXXX"
    elif damage == "older":  # DCMCOPY1: the rows' IPC file and a trailer without the index's offset
        head = bytes(data[trailer:trailer + 24])
        data = data[:rows_end] + head + bytes(16) + b"DCMCOPY1"
    else:
        data = bytearray()
    open(copy, "wb").write(bytes(data))
    with caplog.at_level(logging.WARNING, logger="datacache.manifest_copy"):
        same(Manifest.load(path), m)
    assert "not used" in caplog.text
    before = pa.total_allocated_bytes()
    same(Manifest.load(path), m)  # from the copy written anew by the load before
    assert pa.total_allocated_bytes() - before < 4096


def test_a_copy_being_written_or_that_cannot_be_written_leaves_loads_on_the_parquet_file(mapped, monkeypatch):
    import fcntl

    import datacache.manifest as manifest_module

    m, path, copy = mapped
    fd = os.open(copy + ".tmp", os.O_WRONLY | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another process writes the copy now
    try:
        same(Manifest.load(path), m)
        assert not os.path.exists(copy) and os.path.getsize(copy + ".tmp") == 0  # its file untouched
    finally:
        os.close(fd)
    os.unlink(copy + ".tmp")
    os.mkdir(copy + ".tmp")  # a copy that cannot be written
    same(Manifest.load(path), m)
    assert not os.path.exists(copy)
    os.rmdir(copy + ".tmp")
    same(Manifest.load(path), m)
    assert os.path.exists(copy)
    monkeypatch.setattr(manifest_module, "MAPPED_ROWS", 10 ** 9)  # the manifest shrank below the size
    same(Manifest.load(path), m)
    assert not os.path.exists(copy)  # its old copy deleted


def test_an_unsorted_manifest_file_is_decoded_and_sorted_and_gets_no_copy(mapped, caplog):
    """A manifest file whose rows are out of path order (not one this project writes: an older or
    foreign writer's) cannot be copied a batch at a time: the load decodes and sorts it whole,
    answers as the sorted one, and leaves no copy (nor its temp file)."""
    import logging

    m, path, copy = mapped
    rows = pa.concat_tables([m.table, m.dir_rows])
    pq.write_table(rows.take(list(range(rows.num_rows))[::-1]), path)  # descending paths
    with caplog.at_level(logging.INFO, logger="datacache.manifest_copy"):
        same(Manifest.load(path), m)
    assert "not sorted" in caplog.text
    assert not os.path.exists(copy) and not os.path.exists(copy + ".tmp")


def test_a_leftover_temp_file_gets_the_copys_mode_and_a_directory_that_cannot_take_it_no_write(mapped):
    """A temp file left by a killed writer, of another mode, still gives a copy of mode 0600; in a
    directory its user cannot write (a user other than root: its rename would fail) a load
    answers from the Parquet file without writing a copy, every time, and leaves the temp file
    as it was; a manifest that shrank below the size that gets a copy removes both."""
    import shutil
    import tempfile

    import datacache.manifest as manifest_module

    m = mapped[0]
    home = tempfile.mkdtemp(dir="/tmp")  # not under pytest's root-only directory: nobody reads it
    try:
        path = os.path.join(home, "manifest.parquet")
        copy = path + manifest_module.MAPPED_SUFFIX
        m.save(path)
        with open(copy + ".tmp", "wb"):
            pass
        os.chmod(copy + ".tmp", 0o644)
        same(Manifest.load(path), m)
        assert os.stat(copy).st_mode & 0o777 == 0o600
        os.unlink(copy)
        os.close(os.open(copy + ".tmp", os.O_CREAT | os.O_WRONLY, 0o600))
        for name in (home, path, copy + ".tmp"):
            os.chown(name, 65534, 65534)  # nobody's
        os.chmod(home, 0o500)
        pid = os.fork()
        if pid == 0:  # as nobody: two loads
            status = 1
            try:
                os.setgid(65534)
                os.setuid(65534)
                status = 0 if all(Manifest.load(path).equals(m) for _ in range(2)) else 2
            finally:
                os._exit(status)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
        assert sorted(os.listdir(home)) == [os.path.basename(path), os.path.basename(copy + ".tmp")]
        assert os.path.getsize(copy + ".tmp") == 0  # nothing written into it
        os.chmod(home, 0o700)
        manifest_module.MAPPED_ROWS = 10 ** 9  # the fixture's monkeypatch puts it back
        same(Manifest.load(path), m)
        assert os.listdir(home) == [os.path.basename(path)]
    finally:
        shutil.rmtree(home)


def test_select_of_a_glob_whose_fixed_part_sorts_last_finds_its_paths():
    """A glob whose fixed part is all U+10FFFF has no string after its prefix to bound the range
    of rows: the range runs to the last row."""
    paths = ["a", "\U0010ffffx", "\U0010ffff/y"]
    m = Manifest.from_entries([entry(p) for p in paths])
    assert sorted(e.path for e in m.select("\U0010ffff*")) == sorted(paths[1:])


def test_a_manifest_file_with_a_row_without_a_path_is_decoded_whole_and_gets_no_copy(mapped):
    """A row whose path is null (no writer of this project makes one) cannot be split into files
    and directories a batch at a time: the load decodes the file whole, as a manifest of fewer
    rows does, and answers the same (the copy had dropped the row and counted one file less)."""
    m, path, copy = mapped
    rows = m.table.to_pylist()  # no directory row: the whole decode keeps the row (see _split_dirs)
    rows[0]["path"] = None
    pq.write_table(pa.Table.from_pylist(rows, schema=m.table.schema), path)
    loaded, whole = Manifest.load(path), Manifest(pq.read_table(path))
    assert (loaded.file_num, loaded.total_size, loaded.position("many/f0003")) == \
        (whole.file_num, whole.total_size, whole.position("many/f0003"))
    assert not os.path.exists(copy)
