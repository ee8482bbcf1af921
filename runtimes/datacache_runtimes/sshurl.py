"""``sftp://[user@]host[:port]/path`` URLs, split literally, for the SFTP plugin and the sshfs profile.

A Dataset's ``mountPoint`` is written by hand and not percent-encoded, so the path is kept exactly
as written: spaces, ``#``, ``?`` and ``%`` included (``urllib`` would cut at ``#`` and ``?``).
User and host are checked strictly because they end up as arguments of ssh: a host such as
``-oProxyCommand=...`` must be refused, never taken for an option.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_HOST = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$|^\[[0-9A-Fa-f:.]+\]$")
_USER = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class SSHLocation:
    """Where a mount lives: ``host`` (an IPv6 address keeps its brackets), ``port`` (None: not in
    the URL), ``username`` (None: not in the URL), ``path`` (absolute, as written)."""

    host: str
    port: int | None
    username: str | None
    path: str


def parse(url: str) -> SSHLocation:
    """Split an ``sftp://`` or ``ssh://`` URL. Raises ``ValueError`` saying what is wrong."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("sftp", "ssh"):
        raise ValueError(f"{url!r} is not an sftp:// URL (write sftp://user@host:port/path)")
    netloc, _, path = rest.partition("/")
    user, _, hostport = netloc.rpartition("@")
    host, port = hostport, ""
    if hostport.startswith("["):
        host, _, port = hostport.partition("]")
        host, port = host + "]", port.removeprefix(":")
    elif ":" in hostport:
        host, _, port = hostport.partition(":")
    if not _HOST.match(host):
        raise ValueError(f"{url!r}: {host!r} is not a host name or address")
    if user and not _USER.match(user):
        raise ValueError(f"{url!r}: {user!r} is not a user name")
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise ValueError(f"{url!r}: {port!r} is not a port number")
    return SSHLocation(host, int(port) if port else None, user or None, "/" + path)
