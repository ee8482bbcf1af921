"""Units of datacache_fuse that need no mount (they run even where /dev/fuse is absent)."""

from __future__ import annotations

import errno
import os

import pytest

from datacache.errors import StaleFileError, UFSUnavailableError
from datacache import mountinfo
from datacache_fuse.daemon import mount_options
from datacache_fuse.kernel.errnos import errno_of
from datacache_fuse.inodes import ROOT, InodeTable


def test_inode_table_one_inode_per_version_stable_and_bounded_by_forget():
    from datacache.manifest import FileEntry

    v1 = FileEntry("s3/a.bin", "s3", "b/a.bin", 10, 1.0, "etag-1")
    v2 = FileEntry("s3/a.bin", "s3", "b/a.bin", 20, 2.0, "etag-2")
    t = InodeTable()
    assert t.node(ROOT).path == "" and t.number("", None) == ROOT
    a1 = t.lookup("s3/a.bin", v1, 0)
    d = t.lookup("s3", None, 0)
    a2 = t.lookup("s3/a.bin", v2, 1)
    assert len({a1, d, a2, ROOT}) == 4 and len(t) == 4
    assert t.node(a1).entry is v1 and t.node(a2).entry is v2 and t.node(d).entry is None
    assert t.node(a1).checked == 0 and t.node(a2).checked == 1
    assert t.lookup("s3/a.bin", v1, 0) == a1  # same version, same number
    assert InodeTable().number("s3/a.bin", v1) == a1  # derived from the name: same after a remount
    assert all(ROOT < n < 1 << 63 for n in (a1, a2, d))
    t.forget(a1, 1)
    assert a1 in t  # one lookup left
    t.forget(a1, 1)
    t.forget(ROOT, 5)  # the root stays
    assert a1 not in t and ROOT in t and len(t) == 3
    assert t.number("s3/a.bin", v1) == a1  # forgotten, then the same number again
    with pytest.raises(FileNotFoundError):
        t.node(a1)
    with pytest.raises(FileNotFoundError):
        t.node(0)


def test_stale_names_are_the_entries_the_new_manifest_contradicts():
    from datacache.manifest import FileEntry, Manifest
    from datacache_fuse.changes import stale_names

    def manifest(**versions):
        return Manifest.from_entries(FileEntry(p.replace("__", "/"), "m", p, 1, 0.0, v) for p, v in versions.items())

    old = manifest(keep="1", d__changed="1", d__gone="1", olddir__sub__x="1", d__sub__y="1")
    new = manifest(keep="1", d__changed="2", d__sub__y="1", d__new="1", newdir__deep__z="1")
    assert stale_names(old, new) == {("d", "changed"), ("d", "gone"), ("", "olddir"), ("d", "new"),
                                     ("", "newdir")}
    assert stale_names(old, old) == set()


def test_child_paths_resolve_dot_names_and_reject_slashes():
    assert InodeTable.child("", "s3") == "s3"
    assert InodeTable.child("s3", "a b.txt") == "s3/a b.txt"
    assert InodeTable.child("s3/imgs", ".") == "s3/imgs"
    assert InodeTable.child("s3/imgs", "..") == "s3"
    assert InodeTable.child("", "..") == ""
    for bad in ("", "a/b", "a\0b"):
        with pytest.raises(FileNotFoundError):
            InodeTable.child("s3", bad)


@pytest.mark.parametrize("err, code", [
    (FileNotFoundError("no errno"), errno.ENOENT),
    (FileNotFoundError(errno.ENOENT, "x", "p"), errno.ENOENT),
    (NotADirectoryError("x"), errno.ENOTDIR),
    (StaleFileError("p", "changed"), errno.ESTALE),
    (UFSUnavailableError("p", "down"), errno.EIO),
    (OSError(errno.ENOSPC, "full"), errno.ENOSPC),
    (ValueError("bug"), errno.EIO),
])
def test_errno_mapping_never_turns_enoent_into_eio(err, code):
    assert errno_of(err) == code


def test_mount_options_merge_runtime_and_cli():
    opts = mount_options("demo", "team", {"allow_other": "true", "max_background": "64"},
                         ["noatime,rw", "uid=1000"])
    assert {"ro", "default_permissions", "fsname=datacache:team/demo", "subtype=datacache",
            "allow_other", "max_background=64", "noatime", "uid=1000"} <= opts
    assert "rw" not in opts


def test_mountinfo_parsing_unescapes_paths(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "90 22 0:45 / /mnt/with\\040space rw,nosuid - fuse.datacache datacache:default/demo ro,user_id=0\n"
        "91 22 0:46 / /mnt/with\\040space rw - tmpfs tmpfs rw\n"
        "92 22 0:47 / /mnt/back\\134slash shared:1 master:2 - fuse fs rw\n")
    entries = mountinfo.mounts(str(info))
    assert [e.mountpoint for e in entries] == ["/", "/mnt/with space", "/mnt/with space", "/mnt/back\\slash"]
    assert entries[1].dev == "0:45" and entries[1].is_fuse and entries[1].source == "datacache:default/demo"
    assert not entries[2].is_fuse and entries[3].is_fuse  # optional fields before '-' are skipped


def test_probe_of_a_plain_directory_or_missing_path_is_none(tmp_path):
    assert mountinfo.probe(str(tmp_path)) is mountinfo.MountState.NONE
    assert mountinfo.probe(str(tmp_path / "missing")) is mountinfo.MountState.NONE


def test_canonical_resolves_parents_not_the_last_component(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    os.symlink(real, tmp_path / "link")
    assert mountinfo.canonical(str(tmp_path / "link" / "mnt")) == str(real / "mnt")
    assert mountinfo.canonical(str(tmp_path / "link")) == str(tmp_path / "link")


def test_sequential_reader_loads_the_next_block_ahead_within_the_budget(datacache_home, tmp_path):
    from support import apply_dataset

    from datacache.reader import AHEAD_BLOCKS
    from fuse_support import wait_until

    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(6 * (4 << 20) + 99)
    (src / "f.bin").write_bytes(data)
    plane = apply_dataset(datacache_home, "ahead", [{"name": "local", "mountPoint": str(src)}])
    client = plane.open_dataset("ahead")
    try:
        budget = client.source.readahead.budget
        mib = 1 << 20
        with client.open("f.bin") as f:
            got = [bytes(f.view(off, mib)) for off in range(0, 8 * mib, mib)]  # blocks 0 and 1
            assert b"".join(got) == data[:8 * mib]
            assert AHEAD_BLOCKS == 2
            wait_until(lambda: f.holds(2) and f.holds(3), 10, "blocks 2 and 3 to be loaded ahead")
            assert not f.holds(4)
            assert isinstance(f.view(8 * mib, 100), memoryview)  # no copy inside one block
            assert f.pread(8 * mib - 10, 20) == data[8 * mib - 10:8 * mib + 10]  # across blocks
            assert f.pread(20 * mib, 4 << 20) == data[20 * mib:24 * mib]  # a jump drops the blocks ahead
            assert f.pread(len(data) - 50, 100) == data[-50:]
        wait_until(lambda: budget.used == 0, 10, "the budget to be released")
        with client.open("f.bin") as f:
            assert f.read() == data  # whole-file reads too
        wait_until(lambda: budget.used == 0, 10, "the budget to be released")
    finally:
        client.close()
        plane.close()
