"""Units that need no server: sftp:// URLs are split literally and hosts that could pass for ssh
options are refused; the sshfs launcher's argv keeps every path one literal argument."""

from __future__ import annotations

import os

import pytest

from datacache_runtimes.sshfs import sshfs_argv
from datacache_runtimes.sshurl import SSHLocation, parse
from thin_support import ODD


@pytest.mark.parametrize("url, expected", [
    ("sftp://u@h:2222/a b/#c?d%e", SSHLocation("h", 2222, "u", "/a b/#c?d%e")),
    ("sftp://host.example", SSHLocation("host.example", None, None, "/")),
    ("ssh://me@[::1]:22/x", SSHLocation("[::1]", 22, "me", "/x")),
])
def test_urls_are_split_literally(url, expected):
    assert parse(url) == expected


@pytest.mark.parametrize("url, problem", [
    ("sftp://-oProxyCommand=touch PWNED/x", "is not a host name"),
    ("sftp://-l@h/x", "is not a user name"),
    ("sftp://h:22x/x", "is not a port number"),
    ("s3://b/k", "is not an sftp:// URL"),
])
def test_bad_urls_are_refused(url, problem):
    with pytest.raises(ValueError, match=problem):
        parse(url)


def test_sshfs_argv_keeps_paths_literal(tmp_path):
    target, key = f"/mnt/{ODD}", str(tmp_path / f"key {ODD}")
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        argv, password = sshfs_argv({"name": "m", "mountPoint": f"sftp://u@h:2/srv/{ODD}", "targetPath": target,
                                     "options": {"timeout": 3}, "secretFiles": {"key_filename": key}}, 0, fd)
    finally:
        os.close(fd)
    assert argv[:7] == ["sshfs", f"u@h:/srv/{ODD}", target, "-f", "-p", "2", "-o"]
    identity = next(a for a in argv if a.startswith("IdentityFile="))
    assert identity == f"IdentityFile=/proc/{os.getpid()}/fd/{fd}/identity-0"  # plain characters only
    assert os.readlink(tmp_path / "identity-0") == key and password is None
    assert "ConnectTimeout=3" in argv and "BatchMode=yes" in argv
    with pytest.raises(ValueError, match="unknown option"):
        sshfs_argv({"name": "m", "mountPoint": "sftp://h/x", "targetPath": "/t", "options": {"ProxyCommand": "x"},
                    "secretFiles": {}}, 1, fd)
