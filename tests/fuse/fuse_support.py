"""Helpers of the FUSE tests: the test dataset, mounting through the CLI, clean-up, waiting.

Kept out of ``conftest.py`` so that test modules import them by a name of their own
(``from fuse_support import ...``) rather than ``conftest``, which other test directories also use.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys

from support import wait_for

HAVE_FUSE = os.path.exists("/dev/fuse")
SKIP_REASON = "needs /dev/fuse (FUSE kernel support); install fuse3 and run where /dev/fuse exists"

DATASET = "fusetest"
BLOCK = 4 << 20  # the runtime's block size
BIG_SIZE = 40 * 1024 * 1024 + 7  # not block-aligned on purpose
MEDIUM_SIZE = 5 * 1024 * 1024 + 123
QUARTER_SIZE = 4 * BLOCK  # exactly four blocks: cached fraction steps of 0.25

# Distinctive dummy credentials (moto accepts any): tests assert they never reach a log file.
S3_KEY, S3_SECRET = "AKIAFUSETESTDUMMYKEY", "fuse-dummy-secret-Zq8v"

# Case C7: every awkward character, one file each.
C7_NAMES = ["a?b.txt", "100%.txt", "#hash.txt", "a+b.txt", "with space.txt", "caf\u00e9.txt",
            "\u4e2d\u6587.txt", "-leading.txt"]


@contextlib.contextmanager
def uring_enabled(on: bool = True):
    """With ``on``: the fuse module offers FUSE over io_uring inside the block (see
    :func:`datacache_fuse.kernel.ring_queue.enable_uring_while`). Skips the test where the kernel
    has no FUSE io_uring."""
    from datacache_fuse.kernel.ring_queue import ENABLE_URING, enable_uring_while

    if not on:
        yield
        return
    if not os.path.exists(ENABLE_URING):
        import pytest

        pytest.skip("this kernel has no FUSE over io_uring (Linux >= 6.14 with CONFIG_FUSE_IO_URING)")
    with enable_uring_while():
        yield


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_path(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)


# -- source data -----------------------------------------------------------------------------------
def make_images(rng) -> dict[str, bytes]:
    from PIL import Image

    out = {}
    for i in range(6):
        arr = rng.integers(0, 256, size=(48 + i, 64, 3), dtype="uint8")
        for fmt, ext in (("PNG", "png"), ("JPEG", "jpg")):
            buf = io.BytesIO()
            Image.fromarray(arr).save(buf, format=fmt)
            out[f"imgs/img_{i}.{ext}"] = buf.getvalue()
    return out


def make_parquet() -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": list(range(5000)), "label": [f"class-{i % 17}" for i in range(5000)]})
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=1000)
    return buf.getvalue()


class FuseEnv:
    """The dataset under test: ``home`` (DATACACHE_HOME), ``name``, ``expected`` (dataset path ->
    SHA-256), ``sizes`` (dataset path -> bytes), ``local`` (the local mount's directory)."""

    def __init__(self, home: str, name: str, local: str, s3_objects: dict[str, bytes]):
        self.home, self.name, self.local = home, name, local
        self._s3 = s3_objects
        self.expected: dict[str, str] = {}
        self.sizes: dict[str, int] = {}
        for rel, data in s3_objects.items():
            self.expected[f"s3/{rel}"] = sha256(data)
            self.sizes[f"s3/{rel}"] = len(data)
        for root, _, files in os.walk(local):
            for f in files:
                full = os.path.join(root, f)
                rel = "local/" + os.path.relpath(full, local)
                self.expected[rel] = sha256_path(full)
                self.sizes[rel] = os.path.getsize(full)

    @property
    def shared_files(self) -> list[str]:
        """Dataset paths any test may read: all but ``local/xattr/`` (test_xattr_cached_fraction
        needs it uncached and checks its bytes itself)."""
        return sorted(p for p in self.expected if not p.startswith("local/xattr/"))

    def source(self, path: str) -> bytes:
        """The source bytes of dataset ``path``."""
        if path.startswith("s3/"):
            return self._s3[path[3:]]
        with open(os.path.join(self.local, path[len("local/"):]), "rb") as f:
            return f.read()


def build_env(base: str, moto, bucket: str) -> "FuseEnv":
    """The dataset ``fusetest`` (39 files, ~68 MiB: see conftest.py) written to moto's bucket
    ``bucket`` and a local directory under ``base``, applied under a fresh home ``base/home``."""
    import numpy as np

    rng = np.random.default_rng(7)
    home, local = os.path.join(base, "home"), os.path.join(base, "local")
    os.makedirs(home, mode=0o700)
    objects: dict[str, bytes] = {}
    objects.update(make_images(rng))
    sizes = [0, 1, 4095, 4096, 4097, 65536, 131072 + 3, 1 << 20, (1 << 20) + 1, 300_000, 17, 999, 250_000, 12345]
    for i, n in enumerate(sizes):
        objects[f"small/f_{i:03d}.bin"] = rng.bytes(n)
    for name in C7_NAMES:
        objects[f"names/{name}"] = f"content of {name}\n".encode()
    objects["table.parquet"] = make_parquet()
    objects["medium.bin"] = rng.bytes(MEDIUM_SIZE)
    fs = moto.s3fs(key=S3_KEY, secret=S3_SECRET)
    fs.mkdir(bucket)
    fs.pipe({f"{bucket}/data/{k}": v for k, v in objects.items()})
    for rel, n in (("big.bin", BIG_SIZE), ("xattr/quarter.bin", QUARTER_SIZE), ("nested/deep/er/x.txt", 11)):
        p = os.path.join(local, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(rng.bytes(n))
    # scan warmup off: the shared mount's tests read what is cold and what is not file by file
    apply_dataset(home, DATASET, moto.endpoint_url, bucket, local, fuse={"scanWarmup": False})
    return FuseEnv(home, DATASET, local, objects)


def write_secret(home: str, name: str, key: str, value: str) -> None:
    d = os.path.join(home, "secrets", name)
    os.makedirs(d, mode=0o700, exist_ok=True)
    with open(os.open(os.path.join(d, key), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(value)


def apply_dataset(home: str, name: str, endpoint: str, bucket: str, local: str | None,
                  quota: str = "512Mi", fuse: dict | None = None) -> None:
    """Declare and apply Dataset + CacheRuntime ``name`` (secrets as files, so that daemons started
    as subprocesses find them); ``fuse``: the runtime's ``spec.fuse`` (camelCase keys)."""
    from datacache.api.loader import load_resources
    from datacache.control.embedded import Embedded

    write_secret(home, "moto", "key", S3_KEY)
    write_secret(home, "moto", "secret", S3_SECRET)
    mounts = [{"name": "s3", "mountPoint": f"s3://{bucket}/data", "options": {"endpoint_url": endpoint},
               "encryptOptions": [
                   {"name": "key", "valueFrom": {"secretKeyRef": {"name": "moto", "key": "key"}}},
                   {"name": "secret", "valueFrom": {"secretKeyRef": {"name": "moto", "key": "secret"}}}]}]
    if local:
        mounts.append({"name": "local", "mountPoint": local})
    docs = [{"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": name},
             "spec": {"mounts": mounts}},
            {"apiVersion": "datacache.io/v1alpha1", "kind": "CacheRuntime", "metadata": {"name": name},
             "spec": {"blockSize": "4Mi", "fuse": fuse or {}, "tieredstore": {"levels": [
                 {"mediumtype": "SSD", "path": "cache", "quota": quota}]}}}]
    path = os.path.join(home, f"{name}.yaml")
    with open(path, "w") as f:
        f.write("\n---\n".join(json.dumps(d) for d in docs))
    plane = Embedded(home)
    try:
        plane.apply(load_resources(path))
    finally:
        plane.close()


# -- mounting through the CLI ---------------------------------------------------------------------
def cli(*args: str, timeout: float = 90, home: str | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m datacache_fuse ARGS`` and return the finished process (text output)."""
    cmd = [sys.executable, "-m", "datacache_fuse", *args]
    if home is not None:
        cmd += ["--home", home]
    return subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def mount(env: FuseEnv, mountpoint: str, *extra: str, name: str | None = None) -> int:
    """Mount in the background through the CLI; returns the pid it printed (daemon or supervisor)."""
    r = cli("mount", name or env.name, mountpoint, "--background", *extra, home=env.home)
    assert r.returncode == 0, f"mount failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    m = re.search(r"pid (\d+)", r.stdout)
    assert m, r.stdout
    return int(m.group(1))


def daemon_pid(env_home: str, mountpoint: str) -> int | None:
    from datacache_fuse.daemon import read_state

    state = read_state(env_home, mountpoint)
    return state["pid"] if state else None


def is_listed(mountpoint: str) -> bool:
    from datacache.mountinfo import mounted_at

    top = mounted_at(mountpoint)
    return top is not None and top.is_fuse


def force_cleanup(home: str, mountpoint: str, *pids: int | None) -> None:
    """Lazy-unmount ``mountpoint`` if a FUSE mount is there and kill the given processes and the
    daemon named by the state file. Never raises."""
    pids = [p for p in (*pids, daemon_pid(home, mountpoint)) if p]
    for _ in range(3):
        if not is_listed(mountpoint):
            break
        subprocess.run(["fusermount3", "-u", "-z", mountpoint], capture_output=True)
        if is_listed(mountpoint):
            subprocess.run(["umount", "-l", mountpoint], capture_output=True)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


wait_until = wait_for  # the name this directory's tests use
