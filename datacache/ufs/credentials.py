"""Credentials for UFS mounts, resolved from secret references only.

A mount's ``encryptOptions[i]`` is ``{name: OPTION, valueFrom: {secretKeyRef: {name: SECRET, key:
KEY}}}``; OPTION is handed to the mount's fsspec filesystem (for s3fs: ``key``, ``secret``,
``token``). In embedded mode a secret is looked up, in order, as

1. the environment variable ``DATACACHE_SECRET_<SECRET>_<KEY>`` (upper case, other characters as
   ``_``), then
2. the file ``$DATACACHE_HOME/secrets/<SECRET>/<KEY>`` (trailing newline stripped),

which is how Kubernetes projects a Secret into a pod as files. Values are never logged or put
into messages; :func:`redact` removes them from any text that might carry them.
"""

from __future__ import annotations

import os
import re

from datacache.errors import SecretNotFound


SECRET_ENV_PREFIX = "DATACACHE_SECRET_"
"""Prefix of the environment variables holding secrets in embedded mode."""


def env_name(secret: str, key: str) -> str:
    """Environment variable that holds ``secret``/``key`` in embedded mode."""
    return re.sub(r"[^A-Z0-9]", "_", f"{SECRET_ENV_PREFIX}{secret}_{key}".upper())


def resolve_secret(secret: str, key: str, home: str, where: str) -> str:
    """The value of ``secret``/``key``; ``where`` locates the reference in error messages.

    Raises :class:`SecretNotFound` naming the reference and both places it looked.
    """
    var = env_name(secret, key)
    if var in os.environ:
        return os.environ[var]
    path = os.path.join(home, "secrets", secret, key)
    try:
        with open(path, encoding="utf-8") as f:
            return f.read().rstrip("\n")
    except FileNotFoundError:
        raise SecretNotFound(
            f"{where}: secret {secret!r} key {key!r} not found: set the environment variable {var} "
            f"or write the value to {path}"
        ) from None


def _references(mount, where: str):
    """``(option name, secret, key, where)`` of each ``encryptOptions`` entry of ``mount``."""
    for i, opt in enumerate(mount.encrypt_options or []):
        ref = opt.value_from.secret_key_ref
        yield opt.name, ref.name, ref.key, f"{where}.encryptOptions[{i}]"


def resolve_options(mount, home: str, where: str) -> tuple[dict, list[str]]:
    """Storage options for ``mount`` (a ``datacache.api`` Mount): its ``options`` plus resolved
    ``encryptOptions``. Returns ``(options, secret_values)``; the second list is for :func:`redact`.
    Raises :class:`SecretNotFound` for the first secret that cannot be resolved.
    """
    options = dict(mount.options or {})
    secrets = []
    for option, secret, key, here in _references(mount, where):
        value = options[option] = resolve_secret(secret, key, home, here)
        if value:
            secrets.append(value)
    return options, secrets


def unresolved_secrets(mount, home: str, where: str) -> list[str]:
    """The :class:`SecretNotFound` message of each ``encryptOptions`` entry of ``mount`` whose
    secret cannot be resolved (all of them, where :func:`resolve_options` stops at the first)."""
    missing = []
    for _, secret, key, here in _references(mount, where):
        try:
            resolve_secret(secret, key, home, here)
        except SecretNotFound as err:
            missing.append(str(err))
    return missing


def redact(text: str, secrets: list[str]) -> str:
    """``text`` with every secret value replaced by ``***``."""
    for value in secrets:
        text = text.replace(value, "***")
    return text
