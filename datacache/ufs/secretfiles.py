"""Secrets as file paths: what a runtime plugin or FUSE command receives instead of values.

A mount's ``encryptOptions`` name secrets by reference (see ``datacache.ufs.credentials``). Runtimes
get a *path* per option, never the value, so a value cannot end up in a config file, an argv, a
process listing or a log: a Kubernetes Secret is projected as files anyway, and a private key is a
file to ssh. In embedded mode the path is ``$DATACACHE_HOME/secrets/<secret>/<key>``; a secret
given by environment variable (``DATACACHE_SECRET_<SECRET>_<KEY>``, which wins, as for values) is
written once to ``$DATACACHE_HOME/run/secrets/<secret>/<key>`` (0600) and that path is given.
"""

from __future__ import annotations

import os
import tempfile

from datacache import private
from datacache.ufs.credentials import env_name, resolve_secret


def secret_file(secret: str, key: str, home: str, where: str) -> str:
    """Path of a file holding secret ``secret``/``key`` (see module docstring).

    ``where`` locates the reference in messages. Raises ``ResourceError`` naming both places looked
    at when the secret is in neither.
    """
    var = env_name(secret, key)
    if var in os.environ:
        return _spill(os.path.join(home, "run", "secrets", secret, key), os.environ[var])
    path = os.path.join(home, "secrets", secret, key)
    if not os.path.isfile(path):
        resolve_secret(secret, key, home, where)  # raises the standard "not found" error
    return path


def secret_files(mount, home: str, where: str) -> dict[str, str]:
    """``{option name: file path}`` for a ``datacache.api`` Mount's ``encryptOptions``."""
    return {
        opt.name: secret_file(opt.value_from.secret_key_ref.name, opt.value_from.secret_key_ref.key,
                              home, f"{where}.encryptOptions[{i}]")
        for i, opt in enumerate(mount.encrypt_options)
    }


def _spill(path: str, value: str) -> str:
    """Write ``value`` to ``path`` unless it already holds it; returns ``path``."""
    try:
        with open(path, encoding="utf-8") as f:
            if f.read() == value:
                return path
    except FileNotFoundError:
        pass
    private.makedirs(os.path.dirname(path))
    write_private(path, value)
    return path


def write_private(path: str, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) atomically, mode 0600; the directory must exist."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")  # created 0600
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
