"""Ctrl-C / SIGTERM during ``datacache warmup`` from a slow S3 source (issue 19.1).

The CLI runs as a real process against moto behind a FaultProxy that holds every request
``DELAY_S``; once some files are loaded the proxy stalls every new request (as a store that stops
answering), so segments are surely in flight, and the signal must still end the process within
about a second: phase Cancelled, one summary line, exit 128 + the signal's number, and a second
warmup loads exactly what the first did not.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time

import pytest

from datacache.api.quantity import format_bytes
from datacache.control.embedded import Embedded
from datacache.control.supervisor import wait_until
from support import dataset_yaml, disk_keys, s3_mount

MiB = 1 << 20
DELAY_S = 1.0  # per request: 16 segments in flight load about 16 MiB/s, so 64 MiB take ~4 s
EXIT_WITHIN_S = 2.0  # from the signal to the process's exit


def _dc(*args, home, **kw):
    return subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(home)}, **kw)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_signal_stops_warmup_at_once_cancelled_and_resumable(sig, datacache_home, proxy, bucket_of, tmp_path,
                                                              moto_secrets):
    objects = {f"f{i:02d}.bin": os.urandom(MiB) for i in range(64)}
    total = sum(len(v) for v in objects.values())
    bucket = bucket_of(objects)
    (tmp_path / "ds.yaml").write_text(dataset_yaml("slow", [s3_mount(proxy, bucket)],
                                                   [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}],
                                                   block_size="1Mi"))
    assert _dc("apply", "-f", str(tmp_path / "ds.yaml"), home=datacache_home).returncode == 0
    proxy.delay = DELAY_S
    proc = subprocess.Popen([sys.executable, "-m", "datacache", "warmup", "slow"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "DATACACHE_HOME": str(datacache_home)})
    try:
        plane = Embedded(str(datacache_home))

        def some_loaded():
            docs = plane.state.list("DataLoad")
            return docs and (docs[0].get("status") or {}).get("progress", {}).get("filesDone", 0) >= 4
        assert wait_until(some_loaded, 60), "warmup never loaded a file"
        proxy.set_mode("stall")  # new requests never answer; those already let through finish...
        time.sleep(DELAY_S + 0.5)  # ...within their delay: what is in flight now stays in flight
        proc.send_signal(sig)
        signalled = time.monotonic()
        out, err = proc.communicate(timeout=30)
        took = time.monotonic() - signalled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out, err = out.decode(), err.decode()
    assert proc.returncode == 128 + sig, (proc.returncode, out, err)
    assert took < EXIT_WITHIN_S, f"exited {took:.2f}s after the signal"
    assert "Traceback" not in err and "error" not in err

    [doc] = plane.state.list("DataLoad")
    status = doc["status"]
    assert status["phase"] == "Cancelled" and status["conditions"][0]["reason"] == "Cancelled"
    [target] = status["targets"]
    assert target["phase"] == "Cancelled" and target["failures"] == []
    on_disk = disk_keys(datacache_home / "cache" / "default" / "slow")  # one 1 MiB block per file
    cached = target["cachedBytes"]
    assert cached == len(on_disk) * MiB and 4 * MiB <= cached < total  # the status is what is stored
    [line] = out.splitlines()  # one summary line: what was loaded and what was not
    assert line.startswith(f"dataload.datacache.io/{doc['metadata']['name']}: Cancelled after ")
    assert (f": {format_bytes(cached)} of {format_bytes(total)} cached ({cached // MiB} of 64 files complete), "
            in line), line
    assert line.endswith("the same warmup again loads only the rest")

    proxy.delay = 0.0
    proxy.set_mode("pass")
    again = _dc("warmup", "-q", "slow", home=datacache_home)
    assert again.returncode == 0, again.stderr.decode()
    assert "Complete in " in again.stdout.decode()
    assert f", {format_bytes(total - cached)} loaded from the UFS" in again.stdout.decode()  # only the rest
    for key in ("f00.bin", "f63.bin"):
        cat = _dc("cat", f"slow/{key}", home=datacache_home)
        assert hashlib.sha256(cat.stdout).digest() == hashlib.sha256(objects[key]).digest()
