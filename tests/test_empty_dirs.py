"""What a local source's listing leaves out or keeps, as a user meets it through the CLI: an empty
directory is found by a warmup (issue 18, item 5); symbolic links are skipped, and the sync says
which (issue 18, item 4)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from support import dataset_yaml


def datacache(home, *args: str) -> subprocess.CompletedProcess:
    """``python -m datacache ARGS`` with ``home`` as DATACACHE_HOME, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(home)})


def apply(tmp_path, home, name: str, src) -> None:
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(dataset_yaml(name, [{"name": "local", "mountPoint": str(src)}],
                                 [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]))
    r = datacache(home, "apply", "-f", str(spec))
    assert r.returncode == 0, r.stderr


def test_warmup_of_an_empty_directory_completes_with_0_files(tmp_path, datacache_home):
    src = tmp_path / "src"
    (src / "train").mkdir(parents=True)
    (src / "valid").mkdir()  # as MLPerf Storage's DLIO leaves it
    (src / "train" / "a.bin").write_bytes(os.urandom(3000))
    apply(tmp_path, datacache_home, "dlio", src)
    r = datacache(datacache_home, "warmup", "-q", "dlio", "/valid")
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert re.fullmatch(r"dataload\.datacache\.io/\S+: Complete in \d+\.\ds, 0B loaded from the UFS \(0B/s\)",
                        lines[0]), lines
    assert lines[1:] == ["  /valid: Complete: 0 files, 0B of 0B cached"]
    # A path that is really missing still fails, saying so.
    r = datacache(datacache_home, "warmup", "-q", "dlio", "/nothere")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("error: /nothere: no such file, directory or match in dataset 'dlio'"), r.stderr


def test_sync_names_the_symbolic_links_it_skips(tmp_path, datacache_home):
    src, outside = tmp_path / "src", tmp_path / "outside"
    (src / "sub").mkdir(parents=True)
    outside.mkdir()
    (src / "a.bin").write_text("the regular file\n")
    (outside / "secret.txt").write_bytes(b"beside the mount")
    os.symlink("a.bin", src / "valid")
    os.symlink("nothing-here", src / "dangling")
    os.symlink("loop", src / "loop")
    os.symlink(outside / "secret.txt", src / "outside")
    os.symlink(outside, src / "dirlink")
    os.symlink("../a.bin", src / "sub" / "inner")
    apply(tmp_path, datacache_home, "links", src)

    r = datacache(datacache_home, "sync", "links")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "dataset.datacache.io/links synced: 0 added, 0 changed, 0 deleted"
    assert r.stderr.strip() == (
        "dataset default/links: 6 symbolic links skipped (links are not followed, whether valid, dangling, looping "
        "or leading out of the mount): dangling, dirlink, loop, outside, sub/inner, ...; to read their targets, "
        "copy them into the source or add the directory holding them as another mount")
    # None of them is in the namespace; the directory that held only a link stays, empty.
    r = datacache(datacache_home, "ls", "links")
    assert r.stdout.splitlines() == ["a.bin", "sub/"]
    assert datacache(datacache_home, "ls", "links/sub").stdout == ""
    r = datacache(datacache_home, "cat", "links/valid")
    assert r.returncode != 0 and "Traceback" not in r.stderr
    r = datacache(datacache_home, "cat", "links/a.bin")
    assert (r.returncode, r.stdout) == (0, "the regular file\n")

    # One left: named alone, in the singular.
    for name in ("valid", "dangling", "loop", "outside", "dirlink"):
        os.unlink(src / name)
    r = datacache(datacache_home, "sync", "links")
    assert r.stderr.strip() == (
        "dataset default/links: 1 symbolic link skipped (links are not followed, whether valid, dangling, looping "
        "or leading out of the mount): sub/inner; to read its target, copy it into the source or add the directory "
        "holding it as another mount")
