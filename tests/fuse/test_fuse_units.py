"""Units of datacache_fuse that need no mount (they run even where /dev/fuse is absent)."""

from __future__ import annotations

import errno
import os

import pytest

from datacache.errors import StaleFileError, UFSUnavailableError
from datacache_fuse import mountinfo
from datacache_fuse.daemon import mount_options
from datacache_fuse.errmap import errno_of
from datacache_fuse.inodes import ROOT, InodeTable


def test_inode_table_is_stable_and_lazy():
    t = InodeTable()
    assert t.path(ROOT) == "" and t.inode("") == ROOT
    a = t.inode("s3/a.bin")
    b = t.inode("s3")
    assert a != b and t.inode("s3/a.bin") == a and t.path(a) == "s3/a.bin"
    assert len(t) == 3
    with pytest.raises(FileNotFoundError):
        t.path(9999)
    with pytest.raises(FileNotFoundError):
        t.path(0)


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
