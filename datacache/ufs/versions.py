"""File versions and exact-version reads.

A version string identifies one content of one UFS file:

| UFS                      | version                                  | exact read                       |
|--------------------------|------------------------------------------|----------------------------------|
| S3 (s3fs), OSS, MinIO    | ETag                                     | ranged GET with ``If-Match``     |
|                          |                                          | (obstore, see :mod:`.s3_direct`) |
| GCS (gcsfs)              | generation                               | read, then re-check generation   |
| Azure (adlfs)            | ETag                                     | read, then re-check version      |
| HTTP(S) (fsspec's http)  | ETag, else ``size:Last-Modified``        | ranged GET, its headers checked; |
|                          |                                          | no ETag: a HEAD after it as well |
| local / NFS (``file``)   | ``mtime:size:inode:ctime``               | ``fstat`` before and after pread,|
|                          |                                          | no writer open (lease probe)     |
| anything else            | ``size:mtime``                           | read, then re-check version      |

Where the UFS cannot serve one version by its id (every row but S3 and HTTP with an ETag), the
version is checked again after the read: a file rewritten in place while it is read would give a
block mixing two versions (torn), checksummed and cached under the old version's key. A version
that changed while it was read is stale, never stored (as rclone's local backend refuses a source
"being updated" when its size or modification time changed during the copy).

A local file that another process holds open for writing may be mid-``write()``: the kernel stamps
mtime/ctime when a write starts, so a read overlapping a write that began before the version was
taken passes both ``fstat`` checks with mixed bytes. Those bytes come back as
:class:`~datacache.entry.Unproven`:
right for the caller (what a direct read gives), never stored.

A mismatch raises :class:`~datacache.errors.StaleFileError`; a vanished file raises
``FileNotFoundError`` (ENOENT, never EIO, case C4); a failing UFS raises
:class:`~datacache.errors.UFSUnavailableError` (EIO) after the retries of
:mod:`datacache.ufs.retry`.
"""

from __future__ import annotations

import email.utils
import errno
import fcntl
import os
import signal
import time

from fsspec.asyn import sync

from datacache.entry import Unproven
from datacache.errors import StaleFileError, UFSUnavailableError
from datacache.ufs import s3_direct
from datacache.ufs.retry import DEFAULT_POLICY, RetryPolicy

_VERSION_FIELDS = ("ETag", "etag", "generation", "version_id", "VersionId")
WRITER_WAIT = 0.01  # seconds a local read waits for a writer to close before it reads unproven
SETTLE_SECONDS = 2.0  # without leases: a file changed this recently may be mid-write


def version_of(fs, info: dict) -> str:
    """Version string of the file described by fsspec ``info`` on filesystem ``fs``."""
    if _is_local(fs):
        # ctime too: a rewrite in place keeping size and mtime (cp --preserve=timestamps onto an
        # existing file, normalised archive dates) changes only ctime.
        return f"{info.get('mtime')!r}:{info['size']}:{info.get('ino', 0)}:{info.get('created')!r}"
    for field in _VERSION_FIELDS:
        if info.get(field):
            return str(info[field])
    mtime = info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("Last-Modified") or ""
    return f"{info['size']}:{mtime}"


def mtime_of(info: dict) -> float:
    """Modification time in seconds since the epoch, 0.0 when the UFS gives none."""
    value = (info.get("mtime") or info.get("LastModified") or info.get("last_modified") or info.get("updated")
             or info.get("Last-Modified"))  # HTTP (fsspec's http): an RFC 9110 date
    if value is None or value == "":
        return 0.0
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "timestamp"):
        return value.timestamp()
    try:
        from datetime import datetime

        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(str(value)).timestamp()
    except (TypeError, ValueError):
        return 0.0


def read_exact(fs, ufs_path: str, version: str, start: int, end: int,
               policy: RetryPolicy = DEFAULT_POLICY) -> bytes:
    """Bytes ``[start, end)`` of version ``version`` of ``ufs_path``; may be short only at EOF.

    Raises StaleFileError, FileNotFoundError or UFSUnavailableError (see module docstring); an
    unavailable UFS is retried per ``policy`` first.
    """
    return policy.call(lambda: _read_once(fs, ufs_path, version, start, end))


def _read_once(fs, ufs_path: str, version: str, start: int, end: int) -> bytes:
    try:
        if _is_local(fs):
            return _read_local(ufs_path, version, start, end)
        if _is_s3(fs):
            return _read_s3(fs, ufs_path, version, start, end)
        if _is_http(fs):
            return sync(fs.loop, _read_http, fs, ufs_path, version, start, end)
        data = fs.cat_file(ufs_path, start=start, end=end)
        fs.invalidate_cache(ufs_path)  # a listing's cached info would hide a change
        if version_of(fs, fs.info(ufs_path)) != version:
            raise StaleFileError(ufs_path, "the file changed in the UFS while it was read")
        return data
    except (StaleFileError, UFSUnavailableError):
        raise
    except OSError as err:
        if isinstance(err, FileNotFoundError) or err.errno == errno.ENOENT:
            raise FileNotFoundError(errno.ENOENT, "no such file in the UFS (deleted since the last sync?)",
                                    ufs_path) from None
        raise UFSUnavailableError(ufs_path, f"{type(err).__name__}: {err}") from None
    except Exception as err:  # network stacks raise their own types (aiohttp, botocore)
        raise UFSUnavailableError(ufs_path, f"{type(err).__name__}: {err}") from None


def _is_local(fs) -> bool:
    return "file" in _protocols(fs) or "local" in _protocols(fs)


def _is_s3(fs) -> bool:
    return "s3" in _protocols(fs) and hasattr(fs, "_call_s3")


def _is_http(fs) -> bool:
    return "http" in _protocols(fs) and hasattr(fs, "set_session")


def _protocols(fs) -> tuple:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)


def _local_version(st: os.stat_result) -> str:
    """:func:`version_of` for a local file, from its ``stat``."""
    return f"{st.st_mtime!r}:{st.st_size}:{st.st_ino}:{st.st_ctime!r}"


def _read_local(path: str, version: str, start: int, end: int) -> bytes:
    """``fstat``, no writer open, ``pread``, ``fstat``: a write that starts during the read
    changes ctime (stamped when a write starts; since Linux 6.13 with a fine-grained time once the
    old one was looked at, so two writes a moment apart are told apart) and the bytes are refused;
    a write already running when the version was taken needs a writer's open file, which the
    lease probe sees. Returns :class:`Unproven` bytes when a writer stayed open."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if _local_version(st) != version:
            raise StaleFileError(path, "the file changed on disk since the manifest was taken")
        settled = _no_writer(fd, st)
        data = os.pread(fd, end - start, start)
        if _local_version(os.fstat(fd)) != version:
            raise StaleFileError(path, "the file changed on disk while it was read")
        return data if settled else Unproven(data)
    finally:
        os.close(fd)


def _no_writer(fd: int, st: os.stat_result) -> bool:
    """Whether no process holds the file of ``fd`` (read-only) open for writing, waiting up to
    WRITER_WAIT seconds for one to close. A read lease is granted only then (fcntl(2),
    F_SETLEASE); it is dropped at once, its break signal set to SIGURG, ignored by default. Where
    leases are refused (another owner without CAP_LEASE, a filesystem without them) a file
    changed in the last SETTLE_SECONDS counts as possibly being written."""
    deadline = time.monotonic() + WRITER_WAIT
    while True:
        try:
            fcntl.fcntl(fd, fcntl.F_SETSIG, signal.SIGURG)
            fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        except BlockingIOError:  # EAGAIN: open for writing somewhere
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.001)
            continue
        except OSError:
            return time.time() - st.st_ctime > SETTLE_SECONDS
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return True


async def _read_http(fs, url: str, version: str, start: int, end: int) -> bytes:
    """One ranged GET whose own response headers (ETag, Last-Modified, the total size in
    Content-Range) are checked against ``version``: a HEAD after the read, as fsspec's ``info``
    would send, costs a second round trip per block. A server that ignores ``Range`` (200, whole
    body) is sliced."""
    if start >= end:
        return b""
    kw = dict(fs.kwargs)
    headers = {**kw.pop("headers", {}), "Range": f"bytes={start}-{end - 1}"}
    session = await fs.set_session()
    async with session.get(fs.encode_url(url), headers=headers, **kw) as r:
        if r.status == 404:
            raise FileNotFoundError(errno.ENOENT, "no such file in the UFS", url)
        if r.status == 416:  # the range starts past the end: the file shrank
            raise StaleFileError(url, "the file changed in the UFS (it is shorter now)")
        r.raise_for_status()
        total = r.headers.get("Content-Range", "").rpartition("/")[2]
        info = _http_info(r.headers, int(total) if total.isdigit() else None)
        if version_of(fs, info) != version:
            raise StaleFileError(url, "the file changed in the UFS since the manifest was taken")
        data = await r.read()
    if not info["ETag"]:
        # size and Last-Modified (one-second steps) are no version id: a HEAD after the body
        # tells whether the file changed while it was sent
        kw = dict(fs.kwargs)
        async with session.head(fs.encode_url(url), headers=kw.pop("headers", {}), allow_redirects=True,
                                **kw) as h:
            if h.status == 404:
                raise FileNotFoundError(errno.ENOENT, "no such file in the UFS", url)
            h.raise_for_status()
            if version_of(fs, _http_info(h.headers)) != version:
                raise StaleFileError(url, "the file changed in the UFS while it was read")
    return data if r.status == 206 else data[start:end]


def _http_info(headers, size: int | None = None) -> dict:
    """The fields of an HTTP response's ``headers`` that :func:`version_of` reads; ``size``: the
    file's total size when the response is partial (else Content-Length)."""
    return {"size": size if size is not None else int(headers.get("Content-Length", -1)),
            "ETag": headers.get("ETag"), "Last-Modified": headers.get("Last-Modified")}


def _read_s3(fs, path: str, etag: str, start: int, end: int) -> bytes | memoryview:
    bucket, key, _ = fs.split_path(path)
    store = s3_direct.store_for(fs, bucket) if s3_direct.plain_key(key) else None
    if store is not None:
        return s3_direct.read_range(store, path, key, etag, start, end)
    # Imported here: s3fs and botocore cost ~0.4 s, and only S3 reads need them.
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    # The client directly, not fs._call_s3: s3fs's own retry loop (5 tries) would multiply
    # botocore's tries and ours, and would not cover the body; botocore's tries and timeouts
    # come from the mount's config_kwargs.
    async def get() -> bytes:
        await fs.set_session()
        s3 = await fs.get_s3(bucket)
        # s3fs's per-call settings (requester pays, SSE-C keys) as _call_s3 would add them
        kwargs = fs._get_s3_method_kwargs(s3.get_object, Bucket=bucket, Key=key,
                                          Range=f"bytes={start}-{end - 1}", IfMatch=etag)
        resp = await s3.get_object(**kwargs)
        try:
            return await resp["Body"].read()
        finally:
            resp["Body"].close()

    try:
        return sync(fs.loop, get)
    except ClientError as err:
        code = err.response.get("Error", {}).get("Code")
        if code in ("PreconditionFailed", "412"):
            raise StaleFileError(path, "the object was overwritten in the UFS (ETag changed)") from None
        raise translate_boto_error(err, set_cause=False) from None
