"""Helpers of the fault suite: a dataset on moto's S3 server reached through a FaultProxy."""

from __future__ import annotations

import hashlib
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support.py

from support import apply_dataset, s3_mount  # noqa: E402

# Short per-try bounds (seconds, mount options) so a stalled source fails fast in tests.
FAST_FAIL = {"connect_timeout": 1, "read_timeout": 2}


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def apply_proxied(home, name: str, moto_server, proxy, bucket: str, levels=None, block_size: str = "1Mi"):
    """Apply dataset ``name`` = ``s3://bucket`` read through ``proxy``; returns the control plane."""
    mount = s3_mount(moto_server, bucket)
    mount["options"] = {"endpoint_url": proxy.endpoint_url, **FAST_FAIL}
    return apply_dataset(home, name, [mount], levels, block_size)


def read_all(client, path: str) -> bytes:
    with client.open(path) as f:
        return f.read()


def timed(fn):
    """``(result or exception, seconds)``."""
    t0 = time.monotonic()
    try:
        out = fn()
    except Exception as err:  # the caller asserts on the type
        out = err
    return out, time.monotonic() - t0
