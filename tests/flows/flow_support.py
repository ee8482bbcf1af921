"""Helpers of the data-flow tests: flow documents as YAML text, the datacache command."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from support import s3_mount

LEVELS = [{"mediumtype": "SSD", "path": "cache", "quota": "1Gi"}]


def doc(kind: str, name: str, spec: dict) -> dict:
    return {"apiVersion": "datacache.io/v1alpha1", "kind": kind, "metadata": {"name": name}, "spec": spec}


def local_dataset(name: str, directory) -> list[dict]:
    """A Dataset over a local directory and its CacheRuntime."""
    return [doc("Dataset", name, {"mounts": [{"name": name, "mountPoint": str(directory)}]}),
            doc("CacheRuntime", name, {"tieredstore": {"levels": LEVELS}})]


def s3_storage(moto_server, bucket: str, prefix: str) -> dict:
    """``externalStorage`` of ``s3://bucket/prefix`` on moto, credentials through secret refs."""
    mount = s3_mount(moto_server, bucket, prefix)
    return {"uri": mount["mountPoint"], "options": mount["options"], "encryptOptions": mount["encryptOptions"]}


def write_yaml(path, docs: list[dict]) -> str:
    path.write_text("\n---\n".join(json.dumps(d) for d in docs) + "\n")
    return str(path)


def dc(*args, home, env=None, timeout=300) -> subprocess.CompletedProcess:
    """``datacache ARGS`` in a child process over ``home``; text output."""
    return subprocess.run([sys.executable, "-m", "datacache", *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "DATACACHE_HOME": str(home), **(env or {})})
