"""Ranged S3 GETs through obstore (Rust ``object_store``) for the block reads of an s3fs mount.

Why: a warmup is one ranged GET per block, and on a 2-CPU host the Python S3 stack is the cost.
For 56 x 8 MiB objects from moto behind a delay proxy, aiobotocore spent 1.3-2.2 CPU-s in the
client and the warmup took 1.72-1.86 s; ``obstore.get`` with a range spent 0.64-0.9 CPU-s and
took 1.44-1.60 s in the same minutes (``juicefs warmup``: 1.5 s). s3fs still lists and stats:
only the reads of exactly one version (``If-Match`` on the ETag) come here.

Only mounts whose options obstore can express exactly come here (:func:`store_for` returns None
for the others, which keep the botocore path): key/secret/token or botocore's credential chain,
``anon``, an endpoint, a region, connect/read timeouts. Requester-pays, SSE-C and other
per-request settings, a profile (``AWS_PROFILE``), an endpoint from ``AWS_ENDPOINT_URL``, a
session object, or no endpoint and no region (botocore follows the bucket's region redirect,
obstore does not) stay with botocore.
"""

from __future__ import annotations

import datetime
import errno
import os
import threading
import weakref

from datacache.errors import StaleFileError, UFSUnavailableError

_SIMPLE = {"key", "secret", "token", "anon", "endpoint_url", "client_kwargs", "config_kwargs",
           # fsspec's listing and file-object settings: no bearing on a ranged GET
           "skip_instance_cache", "use_listings_cache", "listings_expiry_time", "max_paths",
           "default_block_size", "default_fill_cache", "default_cache_type"}
_CLIENT_KWARGS = {"endpoint_url", "region_name"}
_CONFIG_KWARGS = {"connect_timeout", "read_timeout", "retries"}
_OVERALL_TIMEOUT = "1h"  # per GET; a stall is caught by read_timeout, a slow link must not fail
_REFRESH = datetime.timedelta(minutes=5)  # how long a refreshable credential is reused
_stores: "weakref.WeakKeyDictionary[object, dict]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def store_for(fs, bucket: str):
    """The ``obstore.store.S3Store`` for ``bucket`` of s3fs filesystem ``fs``, made once per
    (fs, bucket, process: a forked child must not use its parent's client threads); None when
    obstore is not installed or the mount's options are not all expressible (see the module
    docstring)."""
    key = (bucket, os.getpid())
    with _lock:
        per_fs = _stores.setdefault(fs, {})
        if key not in per_fs:
            per_fs[key] = _make_store(fs, bucket)
        return per_fs[key]


def plain_key(key: str) -> bool:
    """Whether obstore can name object ``key``: it refuses empty, ``.`` and ``..`` segments
    (``a//b.jpg``), which S3 keys may have; those keys stay with botocore."""
    return all(part not in ("", ".", "..") for part in key.split("/"))


def read_range(store, path: str, key: str, etag: str, start: int, end: int) -> memoryview:
    """Bytes ``[start, end)`` of object ``key`` while its ETag is ``etag`` (short only at the
    object's end). Raises StaleFileError (the ETag changed), FileNotFoundError (no such object)
    or UFSUnavailableError (any other failure: connection, timeout, credentials, HTTP status);
    ``path`` names the object in messages."""
    import obstore
    from obstore.exceptions import BaseError, NotFoundError, PreconditionError

    if start >= end:
        return memoryview(b"")
    try:
        result = obstore.get(store, key, options={"range": (start, end), "if_match": etag})
        return memoryview(result.bytes())
    except PreconditionError:
        raise StaleFileError(path, "the object was overwritten in the UFS (ETag changed)") from None
    except NotFoundError:
        raise FileNotFoundError(errno.ENOENT, "no such file in the UFS (deleted since the last sync?)",
                                path) from None
    except BaseError as err:  # its first line; the rest is a Rust debug dump of the same
        raise UFSUnavailableError(path, f"{type(err).__name__}: {str(err).partition(chr(10))[0]}") from None


def _make_store(fs, bucket: str):
    try:
        from obstore.store import S3Store
    except ImportError:
        return None
    options = fs.storage_options
    client_kwargs = options.get("client_kwargs") or {}
    config_kwargs = options.get("config_kwargs") or {}
    endpoint = options.get("endpoint_url") or client_kwargs.get("endpoint_url")
    if (set(options) - _SIMPLE or set(client_kwargs) - _CLIENT_KWARGS or set(config_kwargs) - _CONFIG_KWARGS
            or os.environ.get("AWS_PROFILE")
            or (not endpoint and (os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")))):
        return None
    region = client_kwargs.get("region_name") or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not endpoint and not region:
        return None
    client = {"connect_timeout": f"{float(config_kwargs.get('connect_timeout', 60)):g}s",
              "read_timeout": f"{float(config_kwargs.get('read_timeout', 60)):g}s",
              "timeout": _OVERALL_TIMEOUT}
    if endpoint and endpoint.startswith("http://"):
        client["allow_http"] = True
    elif os.environ.get("AWS_CA_BUNDLE"):
        try:
            with open(os.environ["AWS_CA_BUNDLE"], "rb") as f:
                client["root_certificate"] = f.read()
        except OSError:
            return None  # botocore reports the unreadable bundle
    config = {"region": region or "us-east-1", "virtual_hosted_style_request": not endpoint}
    if endpoint:
        config["endpoint"] = endpoint
    kwargs = {"config": config, "client_options": client, "retry_config": {"max_retries": 0}}
    if options.get("anon"):
        config["skip_signature"] = True
    elif options.get("key") and options.get("secret"):
        config.update(access_key_id=options["key"], secret_access_key=options["secret"])
        if options.get("token"):
            config["session_token"] = options["token"]
    else:
        kwargs["credential_provider"] = _BotocoreCredentials()
    return S3Store(bucket, **kwargs)


class _BotocoreCredentials:
    """obstore's credential callback over botocore's chain (environment, shared files, container
    and instance metadata), so a mount without keys signs as s3fs would. Raises
    PermissionError when the chain finds none."""

    def __init__(self):
        self._credentials = None

    def __call__(self) -> dict:
        if self._credentials is None:
            import botocore.session

            self._credentials = botocore.session.get_session().get_credentials()
            if self._credentials is None:
                raise PermissionError("no AWS credentials found (set the mount's secrets or AWS_* variables)")
        frozen = self._credentials.get_frozen_credentials()
        refreshable = hasattr(self._credentials, "refresh_needed")
        expires = datetime.datetime.now(datetime.timezone.utc) + _REFRESH if refreshable else None
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": expires}
