"""Helpers of the ThinRuntime tests: a real OpenSSH server on loopback, test data, clean-up checks.

The server is Debian's ``sshd`` started by the test (``-D``, its own config, a generated host key,
loopback only) and allows one key-only user, the user running the tests (root on CI; a generated
key in our own authorized_keys file, so nothing of the machine's ssh set-up is used or changed).
It only speaks SFTP (``ForceCommand internal-sftp``), so nothing the tests send can run a command
on the server side either.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import re
import signal
import socket
import subprocess
import time

import paramiko

from datacache.api.loader import load_resources
from datacache.control.embedded import Embedded
from datacache.mountinfo import mounts

SSHD = "/usr/sbin/sshd"
ODD = "odd dir; $(touch PWNED) `touch PWNED` & 'q' \"dq\" |x>y"  # a literal name, never a command


class SSHServer:
    """``sshd`` serving files under ``base`` on 127.0.0.1:``port``; ``user``/``key_path`` log in."""

    def __init__(self, base: str):
        self.base = base
        self.user = getpass.getuser()
        self.key_path = os.path.join(base, "client_key")
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self, timeout: float = 10.0) -> "SSHServer":
        for name in ("host_key", "client_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.base, name)],
                           check=True, stdin=subprocess.DEVNULL)
        with open(os.path.join(self.base, "client_key.pub")) as src, \
                open(os.path.join(self.base, "authorized_keys"), "w") as dst:
            dst.write(src.read())
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # privilege separation directory
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        config = os.path.join(self.base, "sshd_config")
        with open(config, "w") as f:
            f.write(f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.base}/host_key\n"
                    f"PidFile none\nAuthorizedKeysFile {self.base}/authorized_keys\nAllowUsers {self.user}\n"
                    "PubkeyAuthentication yes\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    "PermitRootLogin prohibit-password\nUsePAM no\nStrictModes no\n"
                    "Subsystem sftp internal-sftp\nForceCommand internal-sftp\n"
                    "AllowTcpForwarding no\nX11Forwarding no\nMaxStartups 100\nMaxSessions 100\n")
        log = open(os.path.join(self.base, "sshd.log"), "wb")
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", config], stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("sshd did not start: " + open(log.name).read()) from None
                time.sleep(0.05)

    def stop(self) -> None:
        """Stop the sessions (sshd leaves them running when its listener goes), then the listener."""
        if self.proc is not None and self.proc.poll() is None:
            sessions = _children(self.proc.pid)
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):  # a session may end between listing and kill
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5
            while set(sessions) & set(_children(self.proc.pid)) and time.monotonic() < deadline:
                time.sleep(0.05)  # the listener reaps them
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def url(self, path: str) -> str:
        return f"sftp://{self.user}@127.0.0.1:{self.port}{path}"

    def host_key_line(self) -> str:
        """This server's host key as a known_hosts line."""
        with open(os.path.join(self.base, "host_key.pub")) as f:
            kind, key = f.read().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {key}\n"

    @contextlib.contextmanager
    def sftp(self):
        """An SFTP client of our own, to change files the way a user of the server would."""
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        client.connect("127.0.0.1", port=self.port, username=self.user, key_filename=self.key_path,
                       look_for_keys=False, allow_agent=False, timeout=10)
        try:
            yield client.open_sftp()
        finally:
            client.close()


def make_tree(root: str) -> dict[str, bytes]:
    """Files of several sizes (empty, under/over one 64 KiB block, several blocks) under ``root``."""
    files = {"empty.bin": b"", "one.txt": b"1", "small.bin": os.urandom(4095),
             "multi block.bin": os.urandom(300_000), "a/b/deep.bin": os.urandom(70_000),
             "a/name with spaces; $(x).txt": b"literal\n"}
    for rel, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
    return files


def apply_yaml(home: str, text: str) -> tuple[Embedded, list[str]]:
    """Apply resources written as YAML under ``home``'s parent; returns the plane and its lines."""
    path = os.path.join(os.path.dirname(home), "resources.yaml")
    with open(path, "w") as f:
        f.write(text)
    plane = Embedded(home)
    return plane, plane.apply(load_resources(path))


def thin_yaml(name: str, profile: str, mount: dict, runtime_spec: dict | None = None) -> str:
    """A Dataset with one mount and the ThinRuntime binding it (JSON is valid YAML)."""
    import json

    ds = {"apiVersion": "datacache.io/v1alpha1", "kind": "Dataset", "metadata": {"name": name},
          "spec": {"mounts": [mount]}}
    rt = {"apiVersion": "datacache.io/v1alpha1", "kind": "ThinRuntime", "metadata": {"name": name},
          "spec": {"profileName": profile, "blockSize": "64Ki",
                   "tieredstore": {"levels": [{"mediumtype": "SSD", "path": "cache", "quota": "256Mi"}]},
                   **(runtime_spec or {})}}
    return json.dumps(ds) + "\n---\n" + json.dumps(rt) + "\n"


def read_all(plane: Embedded, dataset: str, files: dict[str, bytes]) -> dict[str, str]:
    """SHA-256 of every file as read through the dataset's cache (``plane.open_dataset``)."""
    client = plane.open_dataset(dataset)
    try:
        out = {}
        for rel in files:
            with client.open(rel) as f:
                out[rel] = hashlib.sha256(f.read()).hexdigest()
        return out
    finally:
        client.close()


def change_is_seen_after_sync(server: SSHServer, plane: Embedded, dataset: str, root: str, files: dict) -> None:
    """Warm ``dataset`` up, rewrite ``small.bin`` over SFTP (new size, later mtime), and check that
    reads keep the cached version until a sync, and see the new bytes after it."""
    assert plane.warmup(dataset, [])[1].ok
    new = os.urandom(len(files["small.bin"]) + 1000)
    with server.sftp() as sftp:
        with sftp.open(f"{root}/small.bin", "wb") as f:
            f.write(new)
        later = time.time() + 10
        sftp.utime(f"{root}/small.bin", (later, later))
    assert read_all(plane, dataset, {"small.bin": b""}) == sha({"small.bin": files["small.bin"]})  # pinned
    diff = plane.sync(dataset)
    assert (diff.added, diff.changed, diff.deleted) == ([], ["small.bin"], [])
    assert read_all(plane, dataset, files | {"small.bin": new}) == sha(files | {"small.bin": new})


def read_url(home: str, path: str) -> str:
    """SHA-256 of ``datacache://path`` read through fsspec (a fresh filesystem instance)."""
    import fsspec

    fs = fsspec.filesystem("datacache", home=home, skip_instance_cache=True)
    try:
        return hashlib.sha256(fs.cat_file(path)).hexdigest()
    finally:
        fs.close()


def sha(files: dict[str, bytes]) -> dict[str, str]:
    return {rel: hashlib.sha256(data).hexdigest() for rel, data in files.items()}


def mounts_under(path: str) -> list[str]:
    """Mount points at or below ``path``."""
    path = os.path.realpath(path)
    return [e.mountpoint for e in mounts() if e.mountpoint == path or e.mountpoint.startswith(path + "/")]


def _processes():
    """``(pid, parent pid, state, command line)`` of every process now."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        yield int(pid), int(ppid), state, cmd


def processes_matching(pattern: str) -> list[str]:
    """Command lines of live (not zombie) processes, other than this one, containing ``pattern``."""
    return [cmd for pid, _, state, cmd in _processes() if pattern in cmd and state != "Z" and pid != os.getpid()]


def _children(parent: int) -> list[int]:
    """Live (not zombie) child processes of ``parent``."""
    return [pid for pid, ppid, state, _ in _processes() if ppid == parent and state != "Z"]


def no_pwned(*roots: str) -> list[str]:
    """Files named PWNED* under ``roots``: a shell would have made them."""
    hits = []
    for root in roots:
        for dirpath, _, names in os.walk(root):
            hits += [os.path.join(dirpath, n) for n in names if re.match(r"PWNED", n)]
    return hits
