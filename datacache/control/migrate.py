"""The copy engine of DataMigrate: one tree of files from one fsspec filesystem to another,
resumable, verified and atomic per file.

- **Resumable**: a destination file of the source's size whose content checksum equals the
  source's is skipped (a re-run after a kill copies only what was not finished). The checksum is
  an S3-style ETag where the store gives a plain MD5 one (32 hex digits, no ``-N`` multipart
  suffix), else the MD5 of the bytes, read.
- **Verified**: the bytes copied are counted and hashed on the way; a size different from the
  listing's, or an MD5 different from the source's ETag, fails that file and nothing is renamed.
- **Atomic per file**: on a filesystem with directories (local, NFS, SFTP, ...) a file is written
  as ``.<name>.dcpart-<random>`` beside its destination, then renamed onto it; an object store
  (S3, GCS, Azure, memory) gets the object in one PUT, or a multipart upload completed last (s3fs
  writes that way), so a reader never sees part of an object. Temporary files a killed run left
  behind are removed by the next run.
- **Never overwrites a newer destination** (its modification time after the source's) that
  differs, unless ``overwrite``: it is listed in ``skipped`` instead.

Progress and per-file failures are counted in :class:`MigrateProgress`. Secrets never reach a
message: every error text goes through :func:`datacache.ufs.credentials.redact`.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable

import fsspec

from datacache.ufs.credentials import redact

__all__ = ["MigrateProgress", "copy_tree", "PART_MARK"]

PART_MARK = ".dcpart-"
"""In the name of a file being written (``.<name>.dcpart-<random>``); never a finished file."""
CHUNK = 4 * 1024 * 1024  # bytes read and written at a time
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "adl", "oss", "memory"})
"""Protocols whose writes appear whole (one PUT or a multipart upload completed on close)."""


@dataclass
class MigrateProgress:
    """Figures of one copy (bytes, seconds): files found at the source, copied, skipped because
    already equal at the destination; ``failures`` ``(path, message)``; ``kept`` ``(path,
    reason)`` destination files left as they were (newer, ``overwrite`` off)."""

    files_total: int = 0
    bytes_total: int = 0
    files_done: int = 0
    files_skipped: int = 0
    bytes_done: int = 0
    failures: list[tuple[str, str]] = field(default_factory=list)
    kept: list[tuple[str, str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def rate(self) -> float:
        """Bytes per second copied so far."""
        return self.bytes_done / max(time.monotonic() - self.started, 1e-6)

    def eta(self) -> float | None:
        """Seconds left at the current rate (None before any byte)."""
        rate = self.rate()
        left = self.bytes_total - self.bytes_done
        return None if rate <= 0 or not self.bytes_done else max(left, 0) / rate

    def as_status(self) -> dict[str, float]:
        """``status.progress`` of a DataMigrate."""
        out = {"filesDone": self.files_done, "filesSkipped": self.files_skipped, "filesTotal": self.files_total,
               "bytesDone": self.bytes_done, "bytesTotal": self.bytes_total, "bytesPerSecond": round(self.rate())}
        eta = self.eta()
        if eta is not None:
            out["etaSeconds"] = round(eta, 1)
        return out


def _protocol(fs: fsspec.AbstractFileSystem) -> str:
    proto = fs.protocol
    return (proto[0] if isinstance(proto, (tuple, list)) else proto) or "file"


def _files(fs: fsspec.AbstractFileSystem, root: str) -> dict[str, dict]:
    """Relative path → info of every file under ``root`` (none when it does not exist)."""
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    out = {}
    for name, info in found.items():
        if info.get("type") != "file":
            continue
        rel = posixpath.basename(name) if name.rstrip("/") == root.rstrip("/") else name[len(root.rstrip("/")) + 1:]
        out[rel] = info
    return out


def _etag_md5(info: dict) -> str | None:
    """A plain MD5 ETag of an object (32 hex digits), or None (multipart, other stores)."""
    tag = str(info.get("ETag") or info.get("etag") or "").strip('"').lower()
    return tag if len(tag) == 32 and all(c in "0123456789abcdef" for c in tag) else None


def _mtime(info: dict) -> float | None:
    """Modification time (epoch seconds) from a listing entry, as local, S3 and GCS report it."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        value = info.get(key)
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, datetime):
            return value.timestamp()
    return None


def _md5(fs: fsspec.AbstractFileSystem, path: str, info: dict) -> str:
    """The file's MD5: its ETag when that is one, else computed from its bytes."""
    tag = _etag_md5(info)
    if tag is not None:
        return tag
    digest = hashlib.md5(usedforsecurity=False)
    with fs.open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def copy_tree(src_fs: fsspec.AbstractFileSystem, src_root: str, dst_fs: fsspec.AbstractFileSystem, dst_root: str,
              parallelism: int = 4, overwrite: bool = False, secrets: list[str] = (),  # type: ignore[assignment]
              on_progress: Callable[[MigrateProgress], None] | None = None,
              cancel: threading.Event | None = None) -> MigrateProgress:
    """Copy every file under ``src_root`` to the same relative path under ``dst_root``,
    ``parallelism`` files at once (see the module docstring for what is skipped and how a file is
    written). ``on_progress`` is called after each file and each chunk written (from worker
    threads, under a lock). ``cancel`` set stops before the next chunk; unfinished files leave
    only their temporary names. Returns the figures; per-file errors are in ``failures``,
    never raised. Raises ``FileNotFoundError`` when the source does not exist, ``OSError`` when it
    cannot be listed."""
    src_root, dst_root = src_root.rstrip("/"), dst_root.rstrip("/")
    if not src_fs.exists(src_root):
        raise FileNotFoundError(f"the source {src_root} does not exist")
    sources = _files(src_fs, src_root)
    existing = _files(dst_fs, dst_root)
    for rel in [r for r in existing if PART_MARK in posixpath.basename(r)]:  # left by a killed run
        try:
            dst_fs.rm_file(posixpath.join(dst_root, rel))
        except FileNotFoundError:
            pass
        existing.pop(rel)
    progress = MigrateProgress(files_total=len(sources), bytes_total=sum(int(i.get("size") or 0)
                                                                        for i in sources.values()))
    lock = threading.Lock()
    atomic_put = _protocol(dst_fs) in OBJECT_STORES

    def report() -> None:
        if on_progress is not None:
            on_progress(progress)

    def one(rel: str) -> None:
        src, dst, info = posixpath.join(src_root, rel) if rel else src_root, posixpath.join(dst_root, rel), sources[rel]
        try:
            old = existing.get(rel)
            if old is not None and int(old.get("size") or 0) == int(info.get("size") or 0) \
                    and _md5(dst_fs, dst, old) == _md5(src_fs, src, info):
                with lock:
                    progress.files_skipped += 1
                    progress.bytes_done += int(info.get("size") or 0)
                    report()
                return
            if old is not None and not overwrite:
                newer, source_time = _mtime(old), _mtime(info)
                if newer is not None and source_time is not None and newer > source_time:
                    with lock:
                        progress.kept.append((rel, "the destination differs and is newer than the source: kept "
                                                   "(set spec.overwrite: true to replace it)"))
                        report()
                    return
            _copy_one(src_fs, src, info, dst_fs, dst, atomic_put, lock, progress, report, cancel)
            with lock:
                progress.files_done += 1
                report()
        except Exception as err:  # one file's failure is that file's, in status; the others go on
            with lock:
                progress.failures.append((rel, redact(f"{type(err).__name__}: {err}", list(secrets))))
                report()

    with ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="migrate") as pool:
        list(pool.map(one, sorted(sources)))
    return progress


class _Cancelled(Exception):
    def __str__(self) -> str:
        return "cancelled before the file was complete"


def _copy_one(src_fs, src: str, info: dict, dst_fs, dst: str, atomic_put: bool, lock: threading.Lock,
              progress: MigrateProgress, report: Callable[[], None], cancel: threading.Event | None) -> None:
    """Copy one file, verified, to ``dst``: for an object store straight to the object (whose
    upload is completed only once the bytes are verified: abandoned otherwise), else through a
    temporary name renamed last. Raises on any mismatch, leaving no file at ``dst``."""
    parent = posixpath.dirname(dst)
    target = dst if atomic_put else posixpath.join(parent, f".{posixpath.basename(dst)}{PART_MARK}{uuid.uuid4().hex[:12]}")
    if not atomic_put:
        dst_fs.makedirs(parent, exist_ok=True)
    digest, size, written = hashlib.md5(usedforsecurity=False), int(info.get("size") or 0), 0
    fout = dst_fs.open(target, "wb")
    try:
        with src_fs.open(src, "rb") as fin:
            while chunk := fin.read(CHUNK):
                if cancel is not None and cancel.is_set():
                    raise _Cancelled()
                fout.write(chunk)
                digest.update(chunk)
                written += len(chunk)
                with lock:
                    progress.bytes_done += len(chunk)
                    report()
        if written != size:
            raise OSError(f"read {written} bytes, the listing said {size}: the source changed while copying")
        expected = _etag_md5(info)
        if expected is not None and expected != digest.hexdigest():
            raise OSError(f"MD5 {digest.hexdigest()} of the bytes read differs from the source's ETag {expected}")
        if not atomic_put and hasattr(fout, "fileno"):
            fout.flush()
            os.fsync(fout.fileno())  # the rename below must not outlive the data on a crash
        fout.close()  # an object store's upload completes here, once every byte is verified
        if atomic_put:
            return
        if _protocol(dst_fs) in ("file", "local"):
            os.replace(target, dst)  # fsspec's mv is shutil.move: onto a directory it would move *into* it
        else:
            dst_fs.mv(target, dst)
    except BaseException:
        _abandon(dst_fs, fout, None if atomic_put else target)
        raise


def _abandon(fs, fout, temporary: str | None) -> None:
    """Drop a write that failed: an object store's upload is aborted and the file marked closed
    (fsspec's close would complete it), a temporary file is removed."""
    if temporary is None:
        discard = getattr(fout, "discard", None)
        if discard is not None:
            discard()  # s3fs: AbortMultipartUpload
        try:
            fout.closed = True
        except AttributeError:  # a BytesIO-based file (memory://): left unclosed, it is never stored
            pass
        return
    fout.close()
    try:
        fs.rm_file(temporary)
    except OSError:
        pass
