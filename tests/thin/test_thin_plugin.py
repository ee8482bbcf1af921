"""The Python-plugin way in, exactly as ``runtimes/README.md`` shows it: the guide's plugin (an
in-house store kept in SQLite) is taken from the README, installed as a real entry point in group
``datacache.runtimes``, and read through a ThinRuntime and, by its scheme, through a CacheRuntime."""

from __future__ import annotations

import os
import re
import sqlite3
import time

import pytest

from datacache.errors import ResourceError
from support import dataset_yaml
from thin_support import apply_yaml, read_all, sha, thin_yaml

README = os.path.join(os.path.dirname(__file__), "..", "..", "runtimes", "README.md")
FILES = {"team/images/n01/a.jpg": os.urandom(150_000), "team/images/n01/b.jpg": os.urandom(10),
         "team/images/labels.txt": b"n01 cat\n", "other/x.bin": b"not in the mount"}


@pytest.fixture
def kvfs(tmp_path, monkeypatch):
    """The README's plugin installed (module + dist-info with its entry point), and a store."""
    with open(README) as f:
        code = re.search(r"<!-- example: kvfs_example.py -->\n```python\n(.*?)```", f.read(), re.S).group(1)
    assert len(code.splitlines()) < 50
    site = tmp_path / "site"
    meta = site / "kvfs_example-0.1.dist-info"
    meta.mkdir(parents=True)
    (site / "kvfs_example.py").write_text(code)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: kvfs-example\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text("[datacache.runtimes]\nkvfs = kvfs_example:open_kvfs\n")
    monkeypatch.syspath_prepend(str(site))
    database = str(tmp_path / "store.db")
    with sqlite3.connect(database) as db:
        db.execute("CREATE TABLE files (path TEXT PRIMARY KEY, data BLOB, mtime REAL, version INTEGER)")
        db.executemany("INSERT INTO files VALUES (?, ?, ?, 1)", [(p, d, time.time()) for p, d in FILES.items()])
    return database


PROFILE = ('{"apiVersion": "datacache.io/v1alpha1", "kind": "ThinRuntimeProfile", "metadata": {"name": "kvfs"},'
           ' "spec": {"fileSystemType": "kvfs", "plugin": "kvfs"}}\n---\n')
MINE = {k.removeprefix("team/images/"): v for k, v in FILES.items() if k.startswith("team/images/")}


def test_readme_plugin_through_a_thin_runtime(kvfs, thin_home):
    mount = {"name": "images", "mountPoint": "kvfs://team/images"}
    plane, _ = apply_yaml(thin_home, PROFILE + thin_yaml("team-images", "kvfs", mount, {"options": {"database": kvfs}}))
    _, result = plane.warmup("team-images", [])
    assert result.ok and result.targets[0].files == len(MINE)
    assert read_all(plane, "team-images", MINE) == sha(MINE)
    assert plane.load_manifest(plane.get("Dataset", "team-images")).lookup("n01/a.jpg").version == "1"  # version_id

    with sqlite3.connect(kvfs) as db:  # the store's own version changes: a sync sees it
        db.execute("UPDATE files SET data = ?, version = 2 WHERE path = 'team/images/labels.txt'", (b"n01 dog\n",))
    assert plane.sync("team-images").changed == ["labels.txt"]
    assert read_all(plane, "team-images", {"labels.txt": b""}) == sha({"labels.txt": b"n01 dog\n"})


def test_plugin_scheme_in_a_plain_cache_runtime(kvfs, thin_home):
    mount = {"name": "images", "mountPoint": "kvfs://team/images", "options": {"database": kvfs}}
    plane, _ = apply_yaml(thin_home, dataset_yaml("plain", [mount], [{"mediumtype": "MEM", "quota": "64Mi"}], "64Ki"))
    assert read_all(plane, "plain", MINE) == sha(MINE)


def test_missing_plugin_and_refused_options(kvfs, thin_home):
    profile = PROFILE.replace('"plugin": "kvfs"', '"plugin": "nosuch"')
    mount = {"name": "images", "mountPoint": "kvfs://team/images"}
    with pytest.raises(ResourceError, match=r"no runtime plugin named 'nosuch' is installed \(installed: .*kvfs.*sftp"):
        apply_yaml(thin_home, profile + thin_yaml("a", "kvfs", mount))
    with pytest.raises(ResourceError, match=r"spec.mounts\[0\]: .*refused the mount: unknown option\(s\) colour"):
        apply_yaml(thin_home, PROFILE.replace("kvfs", "sftp") + thin_yaml("b", "sftp", {
            "name": "m", "mountPoint": "sftp://u@127.0.0.1:1/x", "options": {"colour": "red"}}))
