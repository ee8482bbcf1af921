"""sshfs as a FUSE-command profile: ``datacache-sshfs CONFIG`` mounts every mount of a ThinRuntime's
config with Debian's sshfs and stays in the foreground until it is stopped.

Why a launcher rather than ``sshfs`` itself as the profile's command: the profile cannot know the
mounts, the target or the key file, which are in the config file. The launcher turns each mount
into one sshfs argv (no shell anywhere) and supervises the sshfs processes:

- ``sftp://[user@]host[:port]/path`` → ``sshfs [user@]host:/path DIR -f -p PORT -o ...``;
- the key (secret ``key_filename``) and ``known_hosts`` files are given to ssh through symlinks
  with plain names: ssh expands ``%``, ``~`` and ``${VAR}`` in ``IdentityFile`` and
  ``UserKnownHostsFile`` and splits them at spaces, libfuse splits options at commas, and the
  runtime's directory may have any of these in its path. The links live in ``.sshfs/`` next to the
  config file (the runtime's private directory, remade at each start, so a killed launcher leaves
  nothing elsewhere), and ssh reaches them as ``/proc/<launcher pid>/fd/<n>/...`` through a
  directory descriptor the launcher holds open: a path of plain characters that needs no working
  directory (libfuse moves sshfs to ``/``, and sshfs starts ssh again on reconnects);
- secret ``password`` is fed to sshfs's stdin (``password_stdin``); otherwise ``BatchMode=yes``;
- option ``known_hosts`` pins host keys (``StrictHostKeyChecking=yes``); without it the first key
  is trusted (``accept-new``) and remembered for the launcher's lifetime;
- sshfs caches no metadata (``dir_cache=no``, attribute and entry timeouts 0): the cache above
  versions files by mtime, size and inode, so a sync must see the server's current attributes;
- read-only; ``ConnectTimeout`` is option ``timeout`` (default 10 s); keep-alives every 15 s;
  ``reconnect`` after a lost connection.

If one sshfs exits, the others are stopped and the launcher exits with its status; SIGTERM stops
them all. Options: ``username``, ``port``, ``known_hosts``, ``timeout``; secrets: ``key_filename``,
``password`` (the same names as the ``sftp`` plugin's, so one Dataset works with either profile).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

from datacache_runtimes.sshurl import parse

OPTIONS = frozenset({"username", "port", "known_hosts", "timeout"})
SECRETS = frozenset({"key_filename", "password"})
PRIVATE = ".sshfs"  # next to the config file
_FIXED = ("ro,reconnect,dir_cache=no,attr_timeout=0,entry_timeout=0,negative_timeout=0,"
          "ServerAliveInterval=15,ServerAliveCountMax=3")


def sshfs_argv(mount: dict, index: int, private_fd: int) -> tuple[list[str], str | None]:
    """The sshfs argv for config mount ``mount`` (number ``index``), and the password file to feed
    on its stdin (None: key authentication); links the files ssh reads into the directory open as
    ``private_fd``. Raises ``ValueError`` for a bad URL or option."""
    loc = parse(mount["mountPoint"])
    options, secrets = mount.get("options", {}), mount.get("secretFiles", {})
    unknown = sorted(set(options) - OPTIONS) + sorted(set(secrets) - SECRETS)
    if unknown:
        raise ValueError(f"mount {mount['name']!r}: unknown option(s) {', '.join(unknown)} (options: "
                         f"{', '.join(sorted(OPTIONS))}; secrets: {', '.join(sorted(SECRETS))})")
    user = options.get("username") or loc.username
    port = int(options.get("port") or loc.port or 22)
    remote = f"{user + '@' if user else ''}{loc.host}:{loc.path}"
    argv = ["sshfs", remote, mount["targetPath"], "-f", "-p", str(port), "-o", _FIXED,
            "-o", f"ConnectTimeout={int(float(options.get('timeout', 10)))}"]
    if "key_filename" in secrets:
        argv += ["-o", f"IdentityFile={_link(secrets['key_filename'], f'identity-{index}', private_fd)}",
                 "-o", "IdentitiesOnly=yes"]
    if options.get("known_hosts"):
        known = _link(options["known_hosts"], f"known_hosts-{index}", private_fd)
        argv += ["-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known}"]
    else:
        argv += ["-o", "StrictHostKeyChecking=accept-new",
                 "-o", f"UserKnownHostsFile={_seen(private_fd)}/known_hosts"]
    argv += ["-o", "password_stdin" if "password" in secrets else "BatchMode=yes"]
    return argv, secrets.get("password")


def _link(path: str, name: str, private_fd: int) -> str:
    os.symlink(os.path.abspath(path), name, dir_fd=private_fd)
    return f"{_seen(private_fd)}/{name}"


def _seen(private_fd: int) -> str:
    """The private directory as ssh reaches it: plain characters only, valid while we run."""
    return f"/proc/{os.getpid()}/fd/{private_fd}"


def main(argv: list[str] | None = None) -> int:
    """``datacache-sshfs CONFIG``: mount, serve until stopped; returns the exit status (2: bad
    config, 127: sshfs missing, else the first sshfs's status)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: datacache-sshfs CONFIG.json", file=sys.stderr)
        return 2
    if shutil.which("sshfs") is None:
        print("datacache-sshfs: sshfs is not installed (Debian: apt-get install sshfs)", file=sys.stderr)
        return 127
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    procs: list[subprocess.Popen] = []
    private = os.path.join(os.path.dirname(os.path.abspath(args[0])), PRIVATE)
    try:
        with open(args[0], encoding="utf-8") as f:
            mounts = json.load(f)["mounts"]
        shutil.rmtree(private, ignore_errors=True)
        os.mkdir(private, 0o700)
        private_fd = os.open(private, os.O_RDONLY | os.O_DIRECTORY)
        for i, mount in enumerate(mounts):
            cmd, password = sshfs_argv(mount, i, private_fd)
            with open(password or os.devnull, "rb") as stdin:
                procs.append(subprocess.Popen(cmd, stdin=stdin))
        _, status = os.wait()
        return os.waitstatus_to_exitcode(status)
    except (OSError, ValueError, KeyError) as err:
        print(f"datacache-sshfs: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(private, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
