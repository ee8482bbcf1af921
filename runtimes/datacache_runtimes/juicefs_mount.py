"""``python -m datacache_runtimes.juicefs_mount CONFIG MOUNTPOINT [--reader]``: ``juicefs mount`` in
the foreground, with secrets from files and its output redacted.

It runs ``juicefs mount META-URL MOUNTPOINT [--subdir D] FLAGS`` as its child (never through a
shell), with the metadata password and object-storage keys in the child's environment only (see
:mod:`.juicefs_cli`), and copies the child's output to its own with every secret replaced by
``****``. A dead FUSE mount left at MOUNTPOINT by a killed client (ENOTCONN) is lazily unmounted
first, as ``datacache mount`` does for its own daemon. SIGTERM, SIGINT and SIGHUP go on to the
child (which unmounts); it exits with the child's status. With ``--reader`` the mount point is
recorded under the config's ``readersDir`` while it runs, so deleting the Dataset finds it.

CONFIG (JSON, 0600, written by :mod:`.juicefs_engine`): ``binary``, ``metaurl``/``accessKey``/
``secretKey`` (secret file paths), ``subdir``, ``flags`` (list), ``readersDir``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys

from datacache import mountinfo, private
from datacache.mountinfo import MountState
from datacache.ufs.secretfiles import write_private
from datacache_runtimes.juicefs_cli import redact, volume_args


def argv_for(config: dict, url: str, mountpoint: str) -> list[str]:
    """The ``juicefs mount`` argv (foreground) for ``config``, metadata URL ``url`` (no password)."""
    subdir = ["--subdir", config["subdir"]] if config.get("subdir") else []
    return [config["binary"], "mount", url, mountpoint, "--no-usage-report", *subdir, *config["flags"]]


def reader_record(readers_dir: str, mountpoint: str) -> str:
    """The file recording a reader's mount at ``mountpoint`` under ``readers_dir``."""
    return os.path.join(readers_dir, hashlib.sha256(mountpoint.encode()).hexdigest()[:16] + ".json")


def main(args: list[str]) -> int:
    config_path, mountpoint = args[0], mountinfo.canonical(args[1])
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    url, env, hidden = volume_args(config)
    if mountinfo.probe(mountpoint, 5.0) is MountState.DEAD:
        print(f"{mountpoint}: a dead FUSE mount (its client was killed); unmounting it lazily", flush=True)
        mountinfo.lazy_unmount(mountpoint)
    private.makedirs(mountpoint)
    record = None
    if "--reader" in args[2:]:
        record = reader_record(private.makedirs(config["readersDir"]), mountpoint)
        write_private(record, json.dumps({"mountpoint": mountpoint, "pid": os.getpid()}))
    child = subprocess.Popen(argv_for(config, url, mountpoint), env=env, stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    try:
        for line in child.stdout:
            sys.stdout.write(redact(line, hidden))
            sys.stdout.flush()
        return child.wait()
    finally:
        if record is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(record)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
