"""Bearer tokens for the cache workers' data endpoints.

A runtime's token is, in order: the environment variable ``DATACACHE_WORKER_TOKEN`` (how a
Kubernetes Secret reaches a pod), else the file ``$DATACACHE_HOME/runtimes/<namespace>/<name>/
token`` (0600 in a 0700 directory), which ``ensure_token`` creates when the runtime is applied.
Workers and clients read the same place. Tokens are compared with ``hmac.compare_digest`` so the
time taken does not reveal how much of a guess was right; a wrong or missing token gets 401 and
no data. The token never appears in logs, status or errors.
"""

from __future__ import annotations

import hmac
import os
import secrets

from datacache import private
from datacache.errors import ResourceError

ENV = "DATACACHE_WORKER_TOKEN"


def runtime_dir(home: str, namespace: str, name: str) -> str:
    """Directory of a runtime's embedded files (token, pid files): created 0700 on use."""
    return os.path.join(home, "runtimes", namespace, name)


def token_path(home: str, namespace: str, name: str) -> str:
    return os.path.join(runtime_dir(home, namespace, name), "token")


def ensure_token(home: str, namespace: str, name: str) -> None:
    """Create the runtime's token file (256 random bits, 0600) unless the env var or file exists."""
    if os.environ.get(ENV):
        return
    path = token_path(home, namespace, name)
    if os.path.exists(path):
        return
    private.makedirs(os.path.dirname(path))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, private.FILE_MODE)
    with open(fd, "w") as f:
        f.write(secrets.token_urlsafe(32))


def load_token(home: str, namespace: str, name: str) -> str:
    """The runtime's token. Raises ``ResourceError`` naming both places looked when there is none."""
    if os.environ.get(ENV):
        return os.environ[ENV]
    path = token_path(home, namespace, name)
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except FileNotFoundError:
        token = ""
    if not token:
        raise ResourceError(f"no worker token for cacheruntime {namespace}/{name}: set {ENV} or apply the "
                            f"CacheRuntime (it writes {path})")
    return token


def header(token: str) -> dict[str, str]:
    """The request header carrying ``token``."""
    return {"Authorization": f"Bearer {token}"}


def authorized(request_header: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header value carries exactly ``token`` (constant time)."""
    given = (request_header or "").encode()
    return hmac.compare_digest(given, f"Bearer {token}".encode())


def middleware(token: str, open_paths: frozenset[str]):
    """aiohttp middleware: every path outside ``open_paths`` needs the bearer token, else 401."""
    from aiohttp import web  # here: the CLI reads tokens without loading aiohttp

    @web.middleware
    async def check(request, handler):
        if request.path not in open_paths and not authorized(request.headers.get("Authorization"), token):
            return web.json_response({"error": "Unauthorized", "message": "missing or wrong bearer token"},
                                     status=401, headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check
