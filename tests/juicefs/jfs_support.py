"""JuiceFS test helpers: the engine's entry point when the installed metadata predates it, and a
formatted volume (SQLite metadata, data on moto's S3 or a local directory) filled with files."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

from datacache import mountinfo
from datacache.mountinfo import MountState
from support import wait_for  # noqa: F401 - the helper this directory's tests import from here

GROUP = "datacache.engines"


def ensure_entry_point(where: str) -> None:
    """Make entry point ``JuiceFSRuntime`` visible in this process and its children when the
    installed datacache metadata was built before it existed (an editable install of an older
    tree): a ``.dist-info`` with only that entry point, put first on ``sys.path``/``PYTHONPATH``."""
    if any(ep.name == "JuiceFSRuntime" for ep in entry_points(group=GROUP)):
        return
    info = os.path.join(where, "datacache_juicefs_engine-0.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write("Metadata-Version: 2.1\nName: datacache-juicefs-engine\nVersion: 0\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        f.write(f"[{GROUP}]\nJuiceFSRuntime = datacache_runtimes.juicefs_engine\n")
    sys.path.insert(0, where)
    os.environ["PYTHONPATH"] = os.pathsep.join([where, *filter(None, [os.environ.get("PYTHONPATH")])])


def jfs_env() -> dict[str, str]:
    """The environment for the juicefs command: ours without AWS_CA_BUNDLE."""
    return {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}


def format_volume(binary: str, meta_url: str, name: str, storage_args: list[str]) -> None:
    """``juicefs format`` a new volume (``storage_args``: ``--storage s3 --bucket URL ...``)."""
    subprocess.run([binary, "format", *storage_args, "--trash-days", "0", "--no-update", meta_url, name],
                   env=jfs_env(), check=True, capture_output=True, timeout=120)


def fill_volume(binary: str, meta_url: str, where: str, files: dict[str, bytes]) -> None:
    """Write ``files`` (volume path -> bytes) through a foreground ``juicefs mount`` at ``where``,
    then unmount and wait for the client to exit."""
    os.makedirs(where, exist_ok=True)
    proc = subprocess.Popen([binary, "mount", meta_url, where, "--no-usage-report", "--cache-size", "0"],
                            env=jfs_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: proc.poll() is not None or mountinfo.probe(where, 2.0) is MountState.LIVE, 60, "juicefs mount")
        assert proc.poll() is None, "juicefs mount exited"
        for path, data in files.items():
            full = os.path.join(where, path.lstrip("/"))
            os.makedirs(os.path.dirname(full), exist_ok=True)
            with open(full, "wb") as f:
                f.write(data)
    finally:
        subprocess.run(["umount", where], check=False)
        proc.wait(60)


def processes_naming(text: str) -> list[int]:
    """Pids of live (not zombie) processes, other than this one, whose command line has ``text``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode("utf-8", "replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if text in cmd and state != "Z" and int(pid) != os.getpid():
            found.append(int(pid))
    return found


