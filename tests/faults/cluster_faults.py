"""Helpers of the fault suite for runtimes with several real worker processes: the cluster tests'
support (tests/cluster/cluster_support.py) and readers that check every byte while workers die."""

from __future__ import annotations

import os
import random
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "cluster"))

from cluster_support import (apply_cluster, block_bytes, kill_worker, live, reap, stored_keys,  # noqa: E402,F401
                             wait_for, wait_restarted, worker_dirs, write_files)
from datacache.control.supervisor import _start_time  # noqa: E402
from fault_support import sha  # noqa: E402
from support import disk_keys  # noqa: E402,F401


def running(pid: int) -> bool:
    """True while ``pid`` runs: a killed worker stays listed until its heartbeat expires, and is a
    zombie until its supervisor reaps it."""
    return _start_time(pid) is not None


class CheckedReaders:
    """``n`` threads reading random ranges of ``files`` ({dataset path: bytes}) through
    ``read(path, start, end) -> bytes`` until :meth:`stop`; each read's sha256 is compared with the
    source's. ``errors`` lists failed or wrong reads; ``reads``/``checked`` count reads and bytes;
    a read that takes longer than ``hung_s`` seconds is an error too."""

    def __init__(self, read, files: dict[str, bytes], n: int = 4, seed: int = 0, hung_s: float = 30.0):
        self.read, self.files, self.hung_s = read, files, hung_s
        self.errors: list[str] = []
        self.reads = self.checked = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(seed + i,), daemon=True) for i in range(n)]

    def __enter__(self) -> "CheckedReaders":
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop and join the readers; a reader still running after ``hung_s`` is recorded as hung."""
        self._stop.set()
        for t in self._threads:
            t.join(self.hung_s)
            if t.is_alive():
                self.errors.append(f"{t.name} hung")

    def _run(self, seed: int) -> None:
        rng, names = random.Random(seed), sorted(self.files)
        while not self._stop.is_set():
            name = rng.choice(names)
            data = self.files[name]
            start = rng.randrange(len(data))
            end = min(len(data), start + rng.choice([4096, 300_000, len(data)]))
            t0 = time.monotonic()
            try:
                got = self.read(name, start, end)
                problem = None if sha(got) == sha(data[start:end]) else "wrong bytes"
            except Exception as err:  # recorded: the test asserts there were none
                problem = repr(err)
            took = time.monotonic() - t0
            if problem is None and took > self.hung_s:
                problem = f"took {took:.1f} s"
            with self._lock:
                self.reads += 1
                self.checked += end - start
                if problem:
                    self.errors.append(f"{name}[{start}:{end}]: {problem}")
