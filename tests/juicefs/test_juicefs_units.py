"""JuiceFSRuntime pieces that need no binary: the model's checks, the metadata URL split, redaction,
mount flags from tieredstore levels, and parsing of JuiceFS's own figures."""

from __future__ import annotations

import pytest

from datacache.api.loader import load_resource_dict
from datacache.errors import ConfigError, ResourceError
from datacache_runtimes import juicefs_cli
from datacache_runtimes.juicefs_engine import JuiceFSEngine


def _runtime(spec: dict):
    return load_resource_dict({"apiVersion": "datacache.io/v1alpha1", "kind": "JuiceFSRuntime",
                               "metadata": {"name": "jfs"}, "spec": spec}, "test.yaml")


def _dataset(mount: dict):
    return load_resource_dict({"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": "jfs"},
                               "spec": {"mounts": [mount]}}, "test.yaml")


METAURL = {"name": "metaurl", "valueFrom": {"secretKeyRef": {"name": "jfs", "key": "metaurl"}}}


@pytest.mark.parametrize("url, expected", [
    ("redis://:pw@h:6379/1", ("redis://h:6379/1", "pw")),
    ("mysql://u:p%40ss@(h:3306)/db", ("mysql://u@(h:3306)/db", "p%40ss")),
    ("postgres://u:a:b@h:5432/db?sslmode=disable", ("postgres://u@h:5432/db?sslmode=disable", "a:b")),
    ("sqlite3:///var/lib/jfs/meta.db", ("sqlite3:///var/lib/jfs/meta.db", None)),
    ("redis://h:6379/1", ("redis://h:6379/1", None)),
])
def test_split_meta_url(url, expected):
    assert juicefs_cli.split_meta_url(url) == expected


def test_redact_hides_values_and_url_passwords():
    text = "Meta address: redis://:hunter2@h/1 key=SECRETKEY other redis://u:zz@h"
    assert juicefs_cli.redact(text, ["SECRETKEY", "hunter2"]) == \
        "Meta address: redis://:****@h/1 key=**** other redis://u:****@h"


def test_mount_flags_from_levels_and_options():
    levels = [("MEM", "", 64 << 20, 0.5), ("SSD", "/ssd/default/jfs", 10 << 30, 0.2),
              ("HDD", "/hdd/default/jfs", 10 << 30, 0.2)]
    assert juicefs_cli.mount_flags(levels, {"attr-cache": "10", "read-only": "true", "writeback": "false"}) == [
        "--read-only", "--cache-dir", "/ssd/default/jfs:/hdd/default/jfs", "--cache-size", str(20 << 10),
        "--free-space-ratio", "0.2", "--buffer-size", "64", "--attr-cache=10", "--writeback=false"]
    assert juicefs_cli.mount_flags([], {}) == ["--read-only"]


def test_the_free_space_ratio_is_the_levels_else_the_nodes(tmp_path, monkeypatch):
    monkeypatch.setenv("DATACACHE_FREE_SPACE_RATIO", "0.03")
    levels = [{"mediumtype": "SSD", "path": "/ssd", "quota": "1Gi"}]
    flags = JuiceFSEngine(_runtime({"tieredstore": {"levels": levels}}), str(tmp_path)).flags()
    assert flags[flags.index("--free-space-ratio") + 1] == "0.03"
    levels[0]["freeSpaceRatio"] = 0.25
    flags = JuiceFSEngine(_runtime({"tieredstore": {"levels": levels}}), str(tmp_path)).flags()
    assert flags[flags.index("--free-space-ratio") + 1] == "0.25"
    monkeypatch.setenv("DATACACHE_FREE_SPACE_RATIO", "lots")
    with pytest.raises(ConfigError, match="DATACACHE_FREE_SPACE_RATIO"):
        JuiceFSEngine(_runtime({"tieredstore": {"levels": [{"mediumtype": "SSD", "path": "/ssd", "quota": "1Gi"}]}}),
                      str(tmp_path)).flags()


def test_disk_levels_that_juicefs_cannot_keep_apart_are_refused():
    """JuiceFS splits --cache-size evenly over its cache directories (a 16Mi SSD level held
    20 MiB next to a 150Mi HDD one) and keeps one --free-space-ratio."""
    with pytest.raises(ConfigError) as err:
        _runtime({"tieredstore": {"levels": [
            {"mediumtype": "SSD", "path": "/ssd", "quota": "16Mi", "freeSpaceRatio": 0.5},
            {"mediumtype": "HDD", "path": "/hdd", "quota": "150Mi", "freeSpaceRatio": 0.05},
            {"mediumtype": "MEM", "quota": "1Gi"}]}})
    lines = str(err.value).splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "spec.tieredstore.levels[1].quota", "spec.tieredstore.levels[1].freeSpaceRatio"], lines
    assert lines[0].startswith("test.yaml: spec.tieredstore.levels[1].quota: differs from levels[0].quota: "
                               "JuiceFS splits --cache-size evenly over its cache directories")
    _runtime({"tieredstore": {"levels": [{"mediumtype": "SSD", "path": "/ssd", "quota": "1Gi"},
                                         {"mediumtype": "HDD", "path": "/hdd", "quota": "1Gi"}]}})


def test_parse_info_and_check():
    info = ("/mnt :\n  inode: 1\n  files: 6\n   dirs: 3\n length: 1.43 MiB (1505000 Bytes)\n"
            "   size: 1.46 MiB (1531904 Bytes)\n")
    assert juicefs_cli.parse_info(info) == (6, 1505000)
    assert juicefs_cli.parse_info("  files: 0\n length: 0 Bytes\n") == (0, 0)
    line = "<INFO>: check cache: 6 files checked, 1.4 MiB of 1.4 MiB (99.7%) cached [warmup@warmup.go:332]"
    assert juicefs_cli.parse_check(line) == (6, int(1.4 * (1 << 20)), "99.7%")
    with pytest.raises(ValueError, match="unexpected juicefs warmup --check output"):
        juicefs_cli.parse_check("nothing here")


def test_fuse_options_datacache_sets_are_refused():
    with pytest.raises(ConfigError) as err:
        _runtime({"fuse": {"options": {"cache-dir": "/x", "free-space-ratio": "0", "Attr_Cache": "1",
                                       "read-only": "false"}}})
    text = str(err.value)
    assert "spec.fuse.options" in text and "cache-dir, free-space-ratio" in text and "'Attr_Cache'" in text
    assert "option read-only: a Dataset is read-only, so its juicefs mount is too: remove it" in text


def test_metaurl_must_be_a_secret():
    with pytest.raises(ConfigError, match=r"spec.mounts\[0\].options.metaurl: 'metaurl' is a credential"):
        _dataset({"name": "v", "mountPoint": "juicefs:///", "options": {"metaurl": "redis://:pw@h/1"}})


def test_dataset_shape_errors_name_the_field(tmp_path, monkeypatch):
    monkeypatch.setenv("DATACACHE_SECRET_JFS_METAURL", "sqlite3:///nowhere.db")
    engine = JuiceFSEngine(_runtime({}), str(tmp_path))
    two = load_resource_dict({"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": "jfs"},
                              "spec": {"mounts": [{"name": "a", "mountPoint": "juicefs:///"},
                                                  {"name": "b", "mountPoint": "/data"}]}}, "t")
    with pytest.raises(ResourceError, match=r"dataset default/jfs: spec.mounts: a JuiceFSRuntime serves exactly one "
                                            r"mount 'juicefs:///\[sub/dir\]'"):
        engine.config(two)
    with pytest.raises(ResourceError, match=r"spec.mounts\[0\].encryptOptions: give 'metaurl'"):
        engine.config(_dataset({"name": "v", "mountPoint": "juicefs:///"}))
    config = engine.config(_dataset({"name": "v", "mountPoint": "juicefs:///team/a", "encryptOptions": [METAURL]}))
    assert config["subdir"] == "team/a" and "sqlite3" not in str(config)  # a path to the secret, not its value
