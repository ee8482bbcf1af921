"""Hostile paths — '..', absolute paths, NUL bytes, very long names, percent-encoded and
backslash tricks — through DatasetClient, the ``datacache://`` protocol and the CLI never read
outside the dataset: each gets FileNotFoundError (ENOENT) or a one-line CLI error, never the bytes
of a file beside the dataset."""

from __future__ import annotations

import errno
import hashlib
import os

import fsspec
import pytest
from click.testing import CliRunner

from datacache.cache.disk import FILES
from datacache.cli import cli
from security_support import apply_dataset

SECRET = b"TOP-SECRET-BYTES-outside-the-dataset\n"
INSIDE = b"inside the dataset\n"
HOSTILE = [
    "../outside.txt", "../../outside.txt", "sub/../../outside.txt", "sub/../../../etc/passwd",
    "/etc/passwd", "//etc/passwd", "./../outside.txt", "sub/./../..//outside.txt",
    "%2e%2e/outside.txt", "%2e%2e%2foutside.txt", "..%2foutside.txt", "%252e%252e/outside.txt",
    "..\\outside.txt", "sub\\..\\..\\outside.txt", "ok.txt\x00/../../outside.txt", "\x00",
    "a" * 5000, ("d" * 255 + "/") * 20 + "x", "..", "...", "sub/..%00/x", "\u2025/outside.txt",
    "\uff0e\uff0e/outside.txt", "file:///etc/passwd", "s3://bucket/key",
]


@pytest.fixture
def plane(datacache_home, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "ok.txt").write_bytes(INSIDE)
    (src / "sub" / "in.txt").write_bytes(INSIDE)
    (tmp_path / "outside.txt").write_bytes(SECRET)  # beside the mount's root
    p = apply_dataset(datacache_home, "safe", [{"name": "local", "mountPoint": str(src)}],
                      [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}])
    yield p
    p.close()


@pytest.mark.parametrize("path", HOSTILE)
def test_client_paths_stay_inside(plane, path):
    client = plane.open_dataset("safe")
    try:
        for call in (client.stat, client.open, client.listdir):
            with pytest.raises(FileNotFoundError) as info:
                call(path)
            assert info.value.errno == errno.ENOENT
    finally:
        client.close()


@pytest.mark.parametrize("path", HOSTILE)
def test_fsspec_urls_stay_inside(plane, path):
    fs = fsspec.filesystem("datacache", skip_instance_cache=True)
    for url in (f"datacache://safe/{path}", f"datacache://{path}", f"datacache://safe{path}"):
        try:
            data = fs.cat_file(url)
        except (FileNotFoundError, IsADirectoryError):
            continue
        assert SECRET not in data, url
        assert data == INSIDE, url  # only a real dataset file may be read


@pytest.mark.parametrize("path", HOSTILE[:14])
def test_cli_arguments_stay_inside(plane, path, datacache_home):
    runner = CliRunner()
    for args in (["cat", f"safe/{path}"], ["ls", f"safe/{path}"], ["cat", path], ["warmup", "safe", path],
                 ["cat", "-n", path, "safe/ok.txt"]):
        result = runner.invoke(cli, [*args, "--home", str(datacache_home)])
        out = result.stdout_bytes + result.stderr_bytes
        assert SECRET not in out, args
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"{args}: {result.exception!r}") from result.exception
        assert b"Traceback" not in out
        if result.exit_code:
            assert b"error: " in out or b"Error: " in out, (args, out)  # one line, no traceback


def test_symlinks_in_a_local_ufs_are_not_followed(datacache_home, tmp_path):
    """The mount root is a boundary: a symlink in a local UFS is neither listed nor read (as rclone
    without --links/--copy-links), so a hostile link cannot reach $DATACACHE_HOME, the cache
    directory or anything beside the mount; a link loop cannot make a sync walk forever."""
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "ok.txt").write_bytes(INSIDE)
    (tmp_path / "outside.txt").write_bytes(SECRET)
    home, cache = str(datacache_home), str(tmp_path / "cache")
    p = apply_dataset(home, "links", [{"name": "local", "mountPoint": str(src)}],
                      [{"mediumtype": "SSD", "path": cache, "quota": "64Mi"}])
    try:
        client = p.open_dataset("links")
        with client.open("ok.txt") as f:
            f.read()  # a block in the cache directory now
        client.close()
        targets = {"home": home, "state": next(os.path.join(r, n) for r, _, ns in os.walk(home) for n in ns),
                   "cachedir": cache, "block": next(os.path.join(r, n) for r, _, ns in os.walk(cache)
                                                    for n in ns if os.path.basename(r) == FILES),
                   "beside.txt": str(tmp_path / "outside.txt"), "inner.txt": str(src / "ok.txt"),
                   "loop": str(src), "sub/up": ".."}
        for name, target in targets.items():
            os.symlink(target, src / name)
        p.sync("links")
        client = p.open_dataset("links")
        fs = fsspec.filesystem("datacache", skip_instance_cache=True)
        try:
            assert sorted(e.path for e in p.load_manifest(p.get("Dataset", "links"))) == ["ok.txt"]
            for name in targets:
                for path in (name, f"{name}/state.db", f"{name}/outside.txt", f"{name}/ok.txt"):
                    with pytest.raises(FileNotFoundError):
                        client.open(path)
                    with pytest.raises(FileNotFoundError):
                        fs.cat_file(f"datacache://links/{path}")
            with client.open("ok.txt") as f:
                assert hashlib.sha256(f.read()).hexdigest() == hashlib.sha256(INSIDE).hexdigest()
        finally:
            client.close()
            fs.clear_instance_cache()
    finally:
        p.close()
