"""Fixtures of the fault suite: its own moto server, a FaultProxy per test, a filled bucket."""

from __future__ import annotations

import os
import uuid

import pytest

from datacache.demo.s3server import MotoServer
from faultproxy import FaultProxy


@pytest.fixture(scope="session")
def fault_moto():
    """A moto S3 server of this suite's own (other suites may reset the shared one)."""
    with MotoServer() as server:
        yield server


@pytest.fixture
def proxy(fault_moto):
    with FaultProxy(fault_moto.endpoint_url) as p:
        yield p


@pytest.fixture
def bucket_of(fault_moto):
    """``fill(objects) -> bucket``: a fresh bucket holding ``{key: bytes}`` (written directly)."""
    made = []

    def fill(objects: dict[str, bytes]) -> str:
        fs = fault_moto.s3fs()
        name = f"fault-{uuid.uuid4().hex[:12]}"
        fs.mkdir(name)
        fs.pipe({f"{name}/{k}": v for k, v in objects.items()})
        made.append(name)
        return name

    yield fill
    fs = fault_moto.s3fs()
    for name in made:
        fs.invalidate_cache()
        fs.rm(name, recursive=True)


@pytest.fixture
def objects():
    """Random objects: ``cached.bin`` (3 MiB) and one 1 MiB (one block) ``cold-<i>.bin`` per fault."""
    objs = {"cached.bin": os.urandom(3 << 20)}
    objs.update({f"cold-{i}.bin": os.urandom(1 << 20) for i in range(8)})  # one block each
    return objs
