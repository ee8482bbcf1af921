"""The control plane as a fresh user meets it (embedded mode, real CLI subprocesses): condition
times that change only with the condition, what delete removes and says, and what ``datacache
controller`` logs."""

from __future__ import annotations

import json
import os
import time

import yaml

from datacache.control.embedded import Embedded
from datacache.state import StateStore
from test_cli_usability import dc, local_dataset


# conditions ----------------------------------------------------------------------------------------------
def test_condition_times_change_only_when_the_condition_does(datacache_home, tmp_path):
    local_dataset(tmp_path, datacache_home, "cond", {"a.bin": b"a"})
    plane = Embedded(str(datacache_home))
    first = plane.refresh_status("Dataset", "cond")["conditions"][0]
    runtime = plane.refresh_status("CacheRuntime", "cond")["conditions"][0]
    time.sleep(1.1)  # the times have one-second resolution
    assert plane.refresh_status("Dataset", "cond")["conditions"][0] == first
    assert plane.refresh_status("CacheRuntime", "cond")["conditions"][0] == runtime
    described = yaml.safe_load(dc("describe", "dataset", "cond", home=datacache_home, check=True).stdout)
    assert described["status"]["conditions"][0]["lastTransitionTime"] == first["lastTransitionTime"]
    plane.delete("CacheRuntime", "cond")  # Ready goes False: a new time
    unbound = plane.refresh_status("Dataset", "cond")["conditions"][0]
    assert (unbound["status"], unbound["reason"]) == ("False", "NoRuntime")
    assert unbound["lastTransitionTime"] > first["lastTransitionTime"]
    plane.close()


# delete ----------------------------------------------------------------------------------------------
def test_delete_removes_hit_counters_and_says_the_runtime_stays(datacache_home, tmp_path):
    data = os.urandom(100_000)
    local_dataset(tmp_path, datacache_home, "gone", {"a.bin": data})
    assert dc("cat", "gone/a.bin", home=datacache_home, check=True).stdout == data
    stats = datacache_home / "stats" / "default" / "gone"
    assert (stats / "cache.db").exists()  # the read was counted
    out = dc("delete", "dataset", "gone", home=datacache_home, check=True).stdout.decode()
    assert out == ("dataset.datacache.io/gone deleted (cacheruntime gone stays, with its workers and cache: "
                   "datacache delete cacheruntime gone)\n")
    assert not stats.exists()
    state = StateStore(str(datacache_home))
    assert [d["metadata"]["name"] for d in state.list("CacheRuntime")] == ["gone"]
    state.close()
    out = dc("delete", "cacheruntime", "gone", home=datacache_home, check=True).stdout.decode()
    assert out == "cacheruntime.datacache.io/gone deleted\n"
    assert not (datacache_home / "runtimes" / "default" / "gone").exists()
    assert not stats.exists()
    # nor the namespace directories they were in (each was left empty)
    left = sorted(str(p.relative_to(datacache_home)) for p in datacache_home.rglob("*") if p.is_dir())
    assert not [p for p in left if os.path.basename(p) == "default"], left


# controller ---------------------------------------------------------------------------------------------
def test_controller_logs_dataload_runs_and_only_syncs_that_changed_something(datacache_home, tmp_path):
    local_dataset(tmp_path, datacache_home, "ctl", {"a.bin": b"a" * 1000}, {"autoSyncInterval": 1})
    loads = [{"apiVersion": "datacache.io/v1alpha1", "kind": "DataLoad", "metadata": {"name": name},
              "spec": {"dataset": {"name": "ctl"}, "policy": policy, **extra}}
             for name, policy, extra in (("tick", "Cron", {"schedule": "* * * * * */1"}), ("ev", "OnEvent", {}))]
    (tmp_path / "dl.yaml").write_text("\n---\n".join(json.dumps(d) for d in loads))
    dc("apply", "-f", str(tmp_path / "dl.yaml"), home=datacache_home, check=True)
    time.sleep(1.1)  # the Cron schedule's next second and autoSyncInterval have passed; nothing changed
    quiet = dc("controller", "--once", home=datacache_home, check=True).stderr.decode()
    assert "synced" not in quiet
    assert "INFO datacache.controller: dataload default/tick ran on schedule: Complete in " in quiet
    assert "1000B loaded from the UFS" in quiet
    (tmp_path / "ctl-src" / "b.bin").write_bytes(b"b" * 500)
    time.sleep(1.1)
    ran = dc("controller", "--once", home=datacache_home, check=True).stderr.decode()
    assert "INFO datacache.controller: dataset default/ctl synced: 1 added, 0 changed, 0 deleted" in ran
    assert ("INFO datacache.dataloads: dataload default/ev ran on event (1 files added or changed under its "
            "targets): Complete in ") in ran
