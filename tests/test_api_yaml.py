"""Resource YAML: valid files load with Fluid's defaults, mistakes give one exact located line each."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from datacache.api import (
    CacheRuntime,
    DataLoad,
    Dataset,
    KINDS,
    Mount,
    format_bytes,
    load_resource_dict,
    load_resources,
    parse_quantity,
    register_scheme,
    to_document,
    to_yaml,
)
from datacache.errors import ConfigError

HEADER = "apiVersion: datacache.io/v1alpha1\n"

VALID = """\
apiVersion: datacache.io/v1alpha1
kind: Dataset
metadata:
  name: imagenet
  labels: {team: vision}
spec:
  mounts:
    - name: train
      mountPoint: s3://bucket/prefix
      options:
        endpoint_url: http://127.0.0.1:9000
        anon: false
      encryptOptions:
        - name: key
          valueFrom:
            secretKeyRef: {name: s3-credentials, key: access-key}
    - name: labels
      mountPoint: /data/labels
---
apiVersion: datacache.io/v1alpha1
kind: CacheRuntime
metadata:
  name: imagenet
spec:
  replicas: 2
  tieredstore:
    levels:
      - mediumtype: SSD
        path: /mnt/ssd/cache
        quota: 64Mi
      - mediumtype: MEM
        quota: 1.5Gi
        high: "0.9"
        low: 0.5
---
apiVersion: datacache.io/v1alpha1
kind: DataLoad
metadata:
  name: imagenet-warmup
spec:
  dataset: {name: imagenet}
  target:
    - path: /train/shard-*.tar
  policy: Cron
  schedule: "0 3 * * *"
"""


def write(tmp_path: Path, text: str, name: str = "dataset.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def errors_of(tmp_path: Path, text: str, name: str = "dataset.yaml") -> list[str]:
    """Load a file that must be wrong; return its error lines (run from tmp_path: relative name)."""
    path = write(tmp_path, text, name)
    with pytest.raises(ConfigError) as info:
        load_resources(path)
    err = info.value
    assert err.source.startswith(str(path))
    lines = str(err).splitlines()
    assert len(lines) == len(err.problems)
    for line in lines:
        assert "Traceback" not in line and "pydantic" not in line and "For further information" not in line
    prefix = str(path)
    return [line.replace(prefix, name, 1) for line in lines]


def dataset(mounts: str, extra_spec: str = "") -> str:
    return HEADER + "kind: Dataset\nmetadata: {name: d}\nspec:\n  mounts:\n" + mounts + extra_spec


def runtime(levels: str, extra_spec: str = "") -> str:
    return (HEADER + "kind: CacheRuntime\nmetadata: {name: d}\nspec:\n" + extra_spec
            + "  tieredstore:\n    levels:\n" + levels)


# --- valid files ----------------------------------------------------------------------------------


def test_valid_multi_document_file_loads_with_defaults(tmp_path):
    ds, rt, dl = load_resources(write(tmp_path, VALID))
    assert isinstance(ds, Dataset) and isinstance(rt, CacheRuntime) and isinstance(dl, DataLoad)

    assert ds.metadata.name == "imagenet" and ds.metadata.namespace == "default"
    assert ds.metadata.labels == {"team": "vision"}
    train, labels = ds.spec.mounts
    assert (train.path, labels.path) == ("/train", "/labels")  # several mounts: /{name}
    assert (train.scheme, labels.scheme) == ("s3", "file")
    assert train.options == {"endpoint_url": "http://127.0.0.1:9000", "anon": False}
    secret = train.encrypt_options[0].value_from.secret_key_ref
    assert (secret.name, secret.key) == ("s3-credentials", "access-key")
    assert train.read_only is True
    assert ds.spec.access_modes == ["ReadOnlyMany"] and ds.spec.placement == "Exclusive"
    assert ds.status is None

    assert rt.spec.replicas == 2
    assert rt.spec.block_size == "4Mi" and rt.spec.block_size_bytes == 4194304
    ssd, mem = rt.spec.tieredstore.levels
    assert ssd.quota == "64Mi" and ssd.quota_bytes == 64 * 1024 * 1024
    assert (ssd.high, ssd.low) == (0.95, 0.7)
    assert mem.quota_bytes == 1610612736 and (mem.high, mem.low) == (0.9, 0.5)
    assert [lv.mediumtype for lv in rt.spec.tieredstore.ordered_levels] == ["MEM", "SSD"]
    assert rt.spec.fuse.read_ahead_blocks == 4 and rt.spec.fuse.attr_timeout == 7200
    assert rt.spec.worker.port is None

    assert dl.spec.dataset.name == "imagenet" and dl.spec.dataset.namespace == "default"
    assert [t.path for t in dl.spec.target] == ["/train/shard-*.tar"]
    assert dl.spec.policy == "Cron" and dl.spec.load_metadata is False


def test_single_mount_defaults_to_root_path(tmp_path):
    (ds,) = load_resources(write(tmp_path, dataset("  - {name: only, mountPoint: 'gs://b'}\n")))
    assert ds.spec.mounts[0].path == "/"


def test_round_trip_through_to_document_gives_equal_models(tmp_path):
    resources = load_resources(write(tmp_path, VALID))
    doc = to_document(resources[0])
    assert doc["apiVersion"] == "datacache.io/v1alpha1" and doc["kind"] == "Dataset"
    assert doc["spec"]["mounts"][0]["mountPoint"] == "s3://bucket/prefix"
    assert doc["spec"]["mounts"][0]["path"] == "/train"
    assert "status" not in doc and "nodeAffinity" not in doc["spec"]
    again = [load_resource_dict(to_document(r), "round-trip") for r in resources]
    assert again == resources
    assert load_resources("text", to_yaml(resources)) == resources


def test_status_round_trips(tmp_path):
    (ds,) = load_resources(write(tmp_path, dataset("  - {name: a, mountPoint: /x}\n")))
    doc = to_document(ds)
    doc["status"] = {
        "phase": "Bound", "ufsTotal": "1.50GiB", "fileNum": 3,
        "cacheStates": {"cached": "0B", "cacheCapacity": "64.00MiB", "cachedPercentage": "0.0%"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Bound", "message": ""}],
        "mounts": doc["spec"]["mounts"],
    }
    loaded = load_resource_dict(doc, "status")
    assert loaded.status.phase == "Bound" and loaded.status.file_num == 3
    assert loaded.status.cache_states.cache_capacity == "64.00MiB"
    assert load_resource_dict(to_document(loaded), "again") == loaded


def test_unquoted_yaml_timestamps_become_rfc3339_text(tmp_path):
    text = dataset("  - {name: a, mountPoint: /x}\n").replace(
        "metadata: {name: d}", "metadata: {name: d, creationTimestamp: 2024-05-01T10:00:00Z}")
    (ds,) = load_resources(write(tmp_path, text))
    assert ds.metadata.creation_timestamp == "2024-05-01T10:00:00Z"


def test_kinds_map_and_python_construction():
    assert set(KINDS) == {"Dataset", "CacheRuntime", "DataLoad", "ThinRuntime", "ThinRuntimeProfile",
                          "JuiceFSRuntime", "DataMigrate", "DataProcess"}
    ds = Dataset(metadata={"name": "x"}, spec={"mounts": [Mount(name="a", mount_point="/data")]})
    assert ds.kind == "Dataset" and ds.api_version == "datacache.io/v1alpha1"
    assert ds.spec.mounts[0].path == "/"


def test_register_scheme_allows_plugin_schemes(tmp_path):
    text = dataset("  - {name: a, mountPoint: 'myfs-test://cluster/vol'}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.mounts[0].mountPoint: unsupported scheme 'myfs-test' "
        "(known: s3, gs, az, http, https, file, memory, sftp, ...)"
    ]
    register_scheme("myfs-test")
    (ds,) = load_resources(write(tmp_path, text))
    assert ds.spec.mounts[0].scheme == "myfs-test"
    with pytest.raises(ValueError):
        register_scheme("Not A Scheme")


# --- mistakes: one exact line each -----------------------------------------------------------------


def test_unknown_scheme(tmp_path):
    text = dataset("  - {name: a, mountPoint: 's3://b/p'}\n  - {name: b, mountPoint: 'foo://x'}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.mounts[1].mountPoint: unsupported scheme 'foo' "
        "(known: s3, gs, az, http, https, file, memory, sftp, ...)"
    ]


def test_relative_mount_point(tmp_path):
    assert errors_of(tmp_path, dataset("  - {name: a, mountPoint: data/x}\n")) == [
        "dataset.yaml: spec.mounts[0].mountPoint: 'data/x' is neither a URL nor an absolute path: "
        "write scheme://... (e.g. s3://bucket/prefix) or /absolute/local/path"
    ]


def test_missing_mount_point(tmp_path):
    assert errors_of(tmp_path, dataset("  - name: a\n")) == [
        "dataset.yaml: spec.mounts[0].mountPoint: missing required field"
    ]


def test_duplicate_mount_names(tmp_path):
    assert errors_of(tmp_path, dataset("  - {name: a, mountPoint: /x}\n  - {name: a, mountPoint: /y}\n")) == [
        "dataset.yaml: spec.mounts[1].name: duplicate mount name 'a' (also mounts[0])"
    ]


def test_two_mounts_on_the_same_path(tmp_path):
    text = dataset("  - {name: a, mountPoint: /x, path: /data}\n  - {name: b, mountPoint: /y, path: /data}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.mounts[1].path: mount 'b' at '/data' has the same path as "
        "mount 'a' at '/data': give each mount its own path"
    ]


def test_nested_mount_paths(tmp_path):
    text = dataset("  - {name: a, mountPoint: /x, path: /data}\n  - {name: b, mountPoint: /y, path: /data/b}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.mounts[1].path: mount 'b' at '/data/b' is inside mount 'a' at '/data': "
        "mount paths must not be nested"
    ]


def test_root_path_next_to_defaulted_paths(tmp_path):
    text = dataset("  - {name: a, mountPoint: /x, path: /}\n  - {name: b, mountPoint: /y}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.mounts[1].path: mount 'b' at '/b' (the default path) is inside "
        "mount 'a' at '/': mount paths must not be nested"
    ]


def test_unnormalised_mount_path(tmp_path):
    assert errors_of(tmp_path, dataset("  - {name: a, mountPoint: /x, path: /a//b/}\n")) == [
        "dataset.yaml: spec.mounts[0].path: mount path '/a//b/' is not normalised: write '/a/b'"
    ]


def test_bad_quota_string(tmp_path):
    text = runtime("      - {mediumtype: SSD, path: /s, quota: lots}\n      - {mediumtype: MEM, quota: 10GB}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.tieredstore.levels[0].quota: 'lots' is not a quantity: use a byte count "
        "such as 1073741824, or a number with a suffix: Ki, Mi, Gi, Ti, Pi (powers of 1024, "
        "e.g. 64Mi, 1.5Gi) or k, M, G, T, P (powers of 1000, e.g. 500M)",
        "dataset.yaml: spec.tieredstore.levels[1].quota: '10GB' is ambiguous: "
        "write '10Gi' (powers of 1024) or '10G' (powers of 1000)",
    ]


def test_watermark_low_above_high(tmp_path):
    text = runtime("      - {mediumtype: MEM, quota: 1Gi, high: 0.8, low: 0.9}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.tieredstore.levels[0].low: low watermark 0.9 must be below high watermark 0.8"
    ]


def test_free_space_ratio_is_a_disk_levels_fraction(tmp_path):
    text = runtime("      - {mediumtype: MEM, quota: 1Gi, freeSpaceRatio: 0.2}\n"
                   "      - {mediumtype: SSD, path: /s, quota: 1Gi, freeSpaceRatio: 1}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.tieredstore.levels[0].freeSpaceRatio: is the share of a disk level's device kept "
        "free: give it on the SSD or HDD level, not the MEM one",
        "dataset.yaml: spec.tieredstore.levels[1].freeSpaceRatio: must be less than 1, got 1",
    ]


def test_level_rules(tmp_path):
    text = runtime(
        "      - {mediumtype: SSD, quota: 1Gi}\n"
        "      - {mediumtype: MEM, quota: 0, high: 1.5}\n",
        extra_spec="  blockSize: 100k\n",
    )
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.blockSize: '100k' is 100000 bytes, not a multiple of 4096 bytes",
        "dataset.yaml: spec.tieredstore.levels[0].path: missing required field: the SSD level needs a directory",
        "dataset.yaml: spec.tieredstore.levels[1].quota: must be greater than zero, got 0",
        "dataset.yaml: spec.tieredstore.levels[1].high: must be at most 1, got 1.5",
    ]


def test_booleans_are_not_numbers(tmp_path):
    # pydantic's lax mode read these as 1: a one-byte quota, a watermark of 1, one replica
    text = runtime("      - {mediumtype: SSD, path: /s, quota: yes, high: true, freeSpaceRatio: off}\n",
                   extra_spec="  replicas: on\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.replicas: must be a number, got true, yes or on (a boolean to YAML)",
        "dataset.yaml: spec.tieredstore.levels[0].quota: must be a number, got true, yes or on (a boolean to YAML)",
        "dataset.yaml: spec.tieredstore.levels[0].high: must be a number, got true, yes or on (a boolean to YAML)",
        "dataset.yaml: spec.tieredstore.levels[0].freeSpaceRatio: must be a number, got false, no or off "
        "(a boolean to YAML)",
    ]
    fuse = runtime("      - {mediumtype: MEM, quota: 1Gi}\n", extra_spec="  fuse: {scanWarmup: false}\n")
    (rt,) = load_resources(write(tmp_path, fuse))
    assert rt.spec.fuse.scan_warmup is False  # a boolean field still takes one


def test_one_level_per_medium(tmp_path):
    text = runtime("      - {mediumtype: SSD, path: /a, quota: 1Gi}\n      - {mediumtype: SSD, path: /b, quota: 1Gi}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.tieredstore.levels[1].mediumtype: duplicate level 'SSD' (also levels[0]): "
        "use one level per medium"
    ]


def test_bad_dns_name(tmp_path):
    text = HEADER + "kind: Dataset\nmetadata: {name: My_Data}\nspec:\n  mounts: [{name: a, mountPoint: /x}]\n"
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: metadata.name: 'My_Data' is not a valid name: use lowercase letters, digits "
        "and '-' (RFC 1123 label, at most 63 characters)"
    ]


def test_unknown_fields_with_and_without_suggestion(tmp_path):
    text = (HEADER + "kind: Dataset\nmetadata: {name: d, lables: {}}\nspec:\n"
            "  mounts: [{name: a, mountpoint: /x}]\n  placment: Shared\n  foo: 1\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: metadata.lables: unknown field 'lables' (did you mean 'labels'?)",
        "dataset.yaml: spec.mounts[0].mountpoint: unknown field 'mountpoint' (did you mean 'mountPoint'?)",
        "dataset.yaml: spec.placment: unknown field 'placment' (did you mean 'placement'?)",
        "dataset.yaml: spec.foo: unknown field 'foo' "
        "(known fields: mounts, accessModes, placement, nodeAffinity, autoSyncInterval)",
    ]


def test_wrong_types(tmp_path):
    text = runtime("      - {mediumtype: NVME, path: /a, quota: 1Gi}\n", extra_spec="  replicas: two\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.replicas: expected an integer, got 'two'",
        "dataset.yaml: spec.tieredstore.levels[0].mediumtype: expected 'MEM', 'SSD' or 'HDD', got 'NVME'",
    ]


def test_wrong_api_version(tmp_path):
    text = dataset("  - {name: a, mountPoint: /x}\n").replace(HEADER, "apiVersion: data.fluid.io/v1alpha1\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: apiVersion: 'data.fluid.io/v1alpha1' is not supported: expected 'datacache.io/v1alpha1'"
    ]


def test_missing_api_version_and_unknown_kind(tmp_path):
    assert errors_of(tmp_path, "kind: Datset\nmetadata: {name: d}\n") == [
        "dataset.yaml: apiVersion: missing required field: expected 'datacache.io/v1alpha1'",
        "dataset.yaml: kind: unknown kind 'Datset' (known: CacheRuntime, DataLoad, DataMigrate, DataProcess, "
        "Dataset, JuiceFSRuntime, ThinRuntime, ThinRuntimeProfile) (did you mean 'Dataset'?)",
    ]


def test_missing_kind(tmp_path):
    assert errors_of(tmp_path, HEADER + "metadata: {name: d}\n") == [
        "dataset.yaml: kind: missing required field: expected one of CacheRuntime, DataLoad, DataMigrate, "
        "DataProcess, Dataset, JuiceFSRuntime, ThinRuntime, ThinRuntimeProfile"
    ]


def test_empty_file(tmp_path):
    assert errors_of(tmp_path, "# only a comment\n") == ["dataset.yaml: no resources found: the file is empty"]


def test_yaml_syntax_error_has_line_and_column(tmp_path):
    assert errors_of(tmp_path, HEADER + "kind: Dataset\nmetadata:\n  name: d\n   bad: [\n") == [
        "dataset.yaml: invalid YAML at line 5, column 7: mapping values are not allowed here"
    ]


def test_duplicate_yaml_key(tmp_path):
    assert errors_of(tmp_path, HEADER + "kind: Dataset\nkind: DataLoad\n") == [
        "dataset.yaml: invalid YAML at line 3, column 1: duplicate key 'kind' (first written at line 2)"
    ]


def test_document_that_is_not_a_mapping(tmp_path):
    assert errors_of(tmp_path, "- a\n- b\n") == [
        "dataset.yaml: expected a mapping with apiVersion, kind, metadata and spec, got a list"
    ]


def test_inline_secret_value(tmp_path):
    text = dataset("  - name: a\n    mountPoint: s3://b\n    encryptOptions:\n      - {name: secret, value: abc}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.mounts[0].encryptOptions[0].value: inline secret values are not allowed: "
        "store the value in a Secret and reference it with valueFrom.secretKeyRef {name, key}"
    ]


def test_credential_in_plain_options(tmp_path):
    text = dataset("  - name: a\n    mountPoint: s3://b\n    options: {secret: abc}\n")
    assert errors_of(tmp_path, text) == [
        "dataset.yaml: spec.mounts[0].options.secret: 'secret' is a credential: do not write it in "
        "plain text, put it in a Secret and reference it from encryptOptions (valueFrom.secretKeyRef)"
    ]


def dataload(spec: str) -> str:
    return HEADER + "kind: DataLoad\nmetadata: {name: w}\nspec:\n  dataset: {name: d}\n" + spec


def test_cron_dataload_without_schedule(tmp_path):
    assert errors_of(tmp_path, dataload("  policy: Cron\n")) == [
        "dataset.yaml: spec.schedule: missing required field: policy Cron needs a cron schedule, e.g. '0 3 * * *'"
    ]


def test_bad_cron_schedules(tmp_path):
    assert errors_of(tmp_path, dataload("  policy: Cron\n  schedule: '0 3 * *'\n")) == [
        "dataset.yaml: spec.schedule: '0 3 * *' has 4 field(s): a cron schedule has 5 "
        "(minute hour day-of-month month day-of-week, e.g. '0 3 * * *')"
    ]
    assert errors_of(tmp_path, dataload("  policy: Cron\n  schedule: '0 25 * * *'\n")) == [
        "dataset.yaml: spec.schedule: '0 25 * * *': '25' is not a valid hour field (0-23)"
    ]
    (dl,) = load_resources(write(tmp_path, dataload("  policy: Cron\n  schedule: '*/15 1-5 1,15 JAN-jun mon-fri'\n")))
    assert dl.spec.schedule.startswith("*/15")


def test_schedule_without_cron_policy(tmp_path):
    assert errors_of(tmp_path, dataload("  schedule: '0 3 * * *'\n")) == [
        "dataset.yaml: spec.schedule: a schedule is only used with policy Cron (policy is Once): "
        "remove it or set policy: Cron"
    ]


def test_several_documents_name_the_document(tmp_path):
    good = dataset("  - {name: a, mountPoint: /x}\n")
    bad = good.replace("name: d", "name: e").replace("/x", "ftpx://h")
    assert errors_of(tmp_path, good + "---\n" + bad) == [
        "dataset.yaml (document 2, dataset.datacache.io/e): spec.mounts[0].mountPoint: unsupported scheme 'ftpx' "
        "(known: s3, gs, az, http, https, file, memory, sftp, ...)"
    ]
    assert errors_of(tmp_path, good + "---\n" + good) == [
        "dataset.yaml (document 2, dataset.datacache.io/d): metadata.name: Dataset 'default/d' is already defined in "
        "document 1"
    ]


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_resources(tmp_path / "missing.yaml")
    assert str(info.value).endswith("missing.yaml: cannot read the file: No such file or directory")


def test_config_error_is_a_value_error_with_problems(tmp_path):
    with pytest.raises(ValueError) as info:
        load_resources("inline.yaml", "kind: Dataset\n")
    err = info.value
    assert isinstance(err, ConfigError) and err.source == "inline.yaml"
    assert err.problems == [("apiVersion", "missing required field: expected 'datacache.io/v1alpha1'"),
                            ("metadata", "missing required field"), ("spec", "missing required field")]


# --- quantities --------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("64Mi", 64 * 2**20), ("4Mi", 4194304), ("10Gi", 10 * 2**30), ("1.5Gi", 1610612736),
    ("1Ki", 1024), ("2Ti", 2 * 2**40), ("1Pi", 2**50), ("500M", 500_000_000), ("1k", 1000),
    ("1K", 1000), ("3G", 3 * 10**9), ("1T", 10**12), ("1P", 10**15), ("1e3", 1000),
    ("123", 123), (123, 123), (0, 0), ("0.5Ki", 512), ("0.1", 1), ("64MiB", 64 * 2**20),
    ("512B", 512), (" 1Mi ", 2**20), (2.5, 3),
])
def test_parse_quantity(text, expected):
    assert parse_quantity(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "1X", "Mi", "1.2.3", "-1Gi", -5, "10GB", True, None, "1 Gi"])
def test_parse_quantity_rejects(text):
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_parse_quantity_says_what_is_accepted():
    with pytest.raises(ValueError, match=r"Ki, Mi, Gi, Ti, Pi .*k, M, G, T, P"):
        parse_quantity("10 apples")


@pytest.mark.parametrize("n, expected", [
    (0, "0B"), (512, "512B"), (1023, "1023B"), (1024, "1.00KiB"), (64 * 2**20, "64.00MiB"),
    (1610612736, "1.50GiB"), (3 * 2**40, "3.00TiB"), (2**50, "1.00PiB"), (-2048, "-2.00KiB"),
])
def test_format_bytes(n, expected):
    assert format_bytes(n) == expected
