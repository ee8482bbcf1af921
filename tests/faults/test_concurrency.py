"""Concurrency: many readers of one cold block cost one UFS read, threads of one process and
separate processes alike; warmup racing with readers and with a metadata sync that overwrites
files never yields mixed or wrong bytes."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from datacache.control.embedded import Embedded
from datacache.errors import StaleFileError
from fault_support import apply_dataset, apply_proxied, read_all, s3_mount, sha

READERS = 32


def test_many_readers_of_one_cold_block_make_one_ufs_read(datacache_home, moto_secrets, fault_moto, proxy,
                                                           bucket_of, objects):
    plane = apply_proxied(datacache_home, "herd", fault_moto, proxy, bucket_of(objects))
    client = plane.open_dataset("herd")
    try:
        proxy.delay = 0.5  # a slow source: every reader arrives while the fill is in flight
        start = threading.Barrier(READERS)

        def read(_):
            start.wait()
            with client.open("cold-0.bin") as f:
                return sha(f.pread(1000, 4096))

        with ThreadPoolExecutor(READERS) as pool:
            got = list(pool.map(read, range(READERS)))
        assert got == [sha(objects["cold-0.bin"][1000:5096])] * READERS
        assert proxy.object_gets("cold-0.bin") == 1
    finally:
        client.close()
        plane.close()


PROCESSES = 8
_READ_IN_A_PROCESS = """
import hashlib, os, sys, time
import fsspec
home, go = sys.argv[1], sys.argv[2]
while not os.path.exists(go):
    time.sleep(0.005)
with fsspec.open("datacache://herd/big.bin", "rb", home=home, skip_instance_cache=True) as f:
    print(hashlib.sha256(f.read()).hexdigest())
"""
_WARM_IN_A_PROCESS = """
import os, sys, time
from datacache.control.embedded import Embedded
from datacache.warmup import warmup
home, go = sys.argv[1], sys.argv[2]
client = Embedded(home).open_dataset("herd")
while not os.path.exists(go):
    time.sleep(0.005)
print(warmup(client, ["big.bin"]).ok)
client.close()
"""


def _in_processes(n: int, script: str, home, go) -> list[str]:
    """Run ``script`` in ``n`` processes started together (each waits for the file ``go``);
    their outputs, once all exited 0."""
    procs = [subprocess.Popen([sys.executable, "-c", script, str(home), str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(n)]
    try:
        time.sleep(3.0)  # every process imported and waits
        go.touch()
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * n, [err.decode()[-2000:] for _, err in outs]
    return [out.decode().strip() for out, _ in outs]


def test_processes_reading_one_cold_object_make_one_get_per_block(datacache_home, moto_secrets, fault_moto,
                                                                   proxy, bucket_of, tmp_path):
    """Issue 18: DataLoader-like worker processes reading one cold object through ``datacache://``
    made a GET per block per process (291 GETs for 12 blocks with 32 processes); the per-block
    fill lock in the cache directory makes it one per block whichever process asks."""
    data = os.urandom(8 << 20)  # 8 blocks of 1 MiB
    plane = apply_proxied(datacache_home, "herd", fault_moto, proxy, bucket_of({"big.bin": data}))
    plane.close()
    proxy.delay = 0.2  # a slow source: the processes' fills overlap
    assert _in_processes(PROCESSES, _READ_IN_A_PROCESS, datacache_home, tmp_path / "go") == [sha(data)] * PROCESSES
    assert proxy.object_gets("big.bin") == 8


def test_warmups_in_several_processes_fetch_each_block_once(datacache_home, moto_secrets, fault_moto, proxy,
                                                            bucket_of, tmp_path):
    """Warmups of one cold object started together in 4 processes: each segment (here one 1 MiB
    block, see ``dataload._load``) is fetched by one of them, the others find it stored."""
    data = os.urandom(8 << 20)
    plane = apply_proxied(datacache_home, "herd", fault_moto, proxy, bucket_of({"big.bin": data}))
    plane.close()
    proxy.delay = 0.2
    assert _in_processes(4, _WARM_IN_A_PROCESS, datacache_home, tmp_path / "go") == ["True"] * 4
    assert proxy.object_gets("big.bin") == 8
    client = Embedded(str(datacache_home)).open_dataset("herd")
    try:
        assert read_all(client, "big.bin") == data
        assert proxy.object_gets("big.bin") == 8  # all from the cache
    finally:
        client.close()


_TIGHT_READERS = """
import hashlib, os, sys, threading, time
from datacache.control.embedded import Embedded
from datacache.stack import readpath
readpath.READAHEAD_BUDGET = 3 << 20  # fewer blocks than the threads' fills and read-ahead want
home, go = sys.argv[1], sys.argv[2]
client = Embedded(home).open_dataset("tight")
names = sorted(e.path for e in client.manifest)
got = {}
def read(name):
    h = hashlib.sha256()
    with client.open(name) as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    got[name] = h.hexdigest()
while not os.path.exists(go):
    time.sleep(0.005)
threads = [threading.Thread(target=read, args=(n,), daemon=True) for n in names]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
print(" ".join(got.get(n, "unfinished") for n in names))
os._exit(0)  # a reader still stuck would keep the process alive
"""


def test_processes_with_tight_memory_budgets_reading_cold_files_never_deadlock(datacache_home, tmp_path):
    """Fill locks are taken after the memory budget: three processes whose readers wait for their
    budgets while the others' fills hold the blocks' locks all finish (the deadlock of ba67fe1,
    now across processes)."""
    src = tmp_path / "src"
    src.mkdir()
    files = {f"f{i}.bin": os.urandom(8 << 20) for i in range(4)}
    for name, data in files.items():
        (src / name).write_bytes(data)
    apply_dataset(datacache_home, "tight", [{"name": "local", "mountPoint": str(src)}], block_size="1Mi").close()
    outs = _in_processes(3, _TIGHT_READERS, datacache_home, tmp_path / "go")
    assert outs == [" ".join(sha(files[n]) for n in sorted(files))] * 3


def test_warmup_and_reads_race_with_a_sync_that_overwrites_files(datacache_home, moto_secrets, fault_moto,
                                                                   bucket_of):
    rng = random.Random(9)
    old = {f"f{i:02d}.bin": rng.randbytes(rng.randrange(200_000, 900_000)) for i in range(16)}
    bucket = bucket_of(old)
    new = {k: rng.randbytes(rng.randrange(200_000, 900_000)) for k in list(old)[::2]}
    allowed = {k: {sha(v)} | ({sha(new[k])} if k in new else set()) for k, v in old.items()}
    home = str(datacache_home)
    apply_dataset(home, "race", [s3_mount(fault_moto, bucket)],
                  [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}], block_size="64Ki").close()
    errors: list = []
    stop = threading.Event()
    stale = [0]

    def reader(seed: int) -> None:
        plane = Embedded(home)
        client = plane.open_dataset("race")
        r = random.Random(seed)
        try:
            while not stop.is_set():
                client.namespace.reload()  # picks up the sync; open files keep their version
                name = r.choice(sorted(old))
                try:
                    got = sha(read_all(client, name))
                except StaleFileError:
                    stale[0] += 1  # an uncached part of an overwritten file: refused, not mixed
                    continue
                if got not in allowed[name]:
                    errors.append(f"{name}: bytes of neither version")
        except Exception as err:  # reported below, with where it came from
            errors.append(f"{err!r} at {traceback.format_exc(limit=-4)}")
        finally:
            client.close()
            plane.close()

    def warmer() -> None:
        plane = Embedded(home)
        try:
            while not stop.is_set():
                plane.warmup("race", ["/"])
        except Exception as err:
            errors.append(f"{err!r} at {traceback.format_exc(limit=-4)}")
        finally:
            plane.close()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)] + [threading.Thread(target=warmer)]
    for t in threads:
        t.start()
    try:
        fs = fault_moto.s3fs()
        for k, v in new.items():  # overwrite half the files while everything runs, then sync
            fs.pipe(f"{bucket}/{k}", v)
        plane = Embedded(home)
        # Readers that met an overwritten file refreshed its entry already (case C5); the sync
        # takes the rest.
        diff = plane.sync("race")
        assert set(diff.changed) <= set(new) and not diff.added and not diff.deleted
        threading.Event().wait(2.0)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not any(t.is_alive() for t in threads), "a reader or warmup hung"
    assert not errors, errors[:5]
    client = plane.open_dataset("race")
    try:
        for k, v in old.items():
            assert sha(read_all(client, k)) == sha(new.get(k, v))
    finally:
        client.close()
        plane.close()
