"""A realistic, deterministic training set for the demo, tests and benchmarks.

Real file formats, because a cache that only ever sees ``b"x" * n`` proves little:

- an ImageNet-style tree of real JPEGs (``train/n0XXXXXXX/n0XXXXXXX_<k>.JPEG``) whose sizes spread
  log-uniformly over 20–300 KB, like photos do;
- Parquet files with several columns and row groups (what pyarrow/pandas readers range-read);
- one WebDataset-style tar shard of ~256 MiB (``sampleNNNNNN.jpg`` + ``sampleNNNNNN.cls``), the
  large sequential-read case;
- a few small local files (labels, class list, splits) for a second, POSIX mount.

Everything is a pure function of ``seed`` for a given Pillow/libjpeg and pyarrow version, and the
writers return sha256 checksums computed from the bytes as they are written, so tests can compare
what a reader got against the source without downloading it again.

Speed: JPEGs are not drawn one by one. A handful of textured base images (smooth multi-octave noise
plus pixel noise of different strengths) are made once with numpy; each file is a crop of one of
them, flipped and tinted per class, encoded at a quality picked so the file lands near a target
size (bytes-per-pixel is calibrated once per base and quality; ~1.5 % of files need a second
encode). Encoding is ~2 ms a file. Uploads go in batches through ``fs.pipe`` (s3fs sends a batch
concurrently) from a helper thread while the next batch is encoded; the tar shard is streamed
through ``fs.open(..., "wb")`` by a helper thread, so it is never held in memory.

Measured on 2 cores into moto (moto's server is then the bottleneck and takes one core, so the
overlap buys little there; it does with more cores): 2000 JPEGs ~11 s, 3 Parquet files ~1 s,
the 256 MiB shard ~13 s — the full ``build_demo_dataset`` ~28 s. Locally, 2000 JPEGs take ~4 s.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import posixpath
import queue
import tarfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, Iterator

import numpy as np

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "JPEG_MIN_BYTES",
    "JPEG_MAX_BYTES",
    "sha256_bytes",
    "sha256_file",
    "class_ids",
    "make_jpeg_tree",
    "make_parquet_files",
    "make_tar_shard",
    "make_local_extras",
    "build_demo_dataset",
]

#: 256 MiB plus an odd amount, so the shard is not a multiple of any block size.
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024 + 777_777
JPEG_MIN_BYTES = 20 * 1000
JPEG_MAX_BYTES = 300 * 1000
_TARGET_MIN = 22_000  # targets sit inside the bounds, leaving room for the size estimate's error
_TARGET_MAX = 285_000
_FIXED_MTIME = 1_700_000_000  # tar member mtime: fixed, so the shard's bytes depend on the seed only
_PIPE_BATCH = 128  # files per fs.pipe call (bounds memory; s3fs uploads one batch concurrently)


# -- helpers -------------------------------------------------------------------------------------

def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike, fs: Any = None, chunk: int = 4 * 1024 * 1024) -> str:
    """sha256 of a local file, or of ``path`` on the fsspec filesystem ``fs``, read in chunks."""
    h = hashlib.sha256()
    opener = fs.open if fs is not None else open
    with opener(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def _local_fs(fs: Any):
    if fs is None:
        from fsspec.implementations.local import LocalFileSystem

        return LocalFileSystem()
    return fs


def _is_local(fs: Any) -> bool:
    protocol = getattr(fs, "protocol", "")
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return "file" in protocols or "local" in protocols


def _join(root: str, *parts: str) -> str:
    return posixpath.join(str(root).rstrip("/"), *parts)


def _write_many(fs: Any, items: dict[str, bytes]) -> None:
    """Write a batch of small files: concurrently on remote filesystems, making parents locally."""
    if _is_local(fs):
        for parent in {posixpath.dirname(p) for p in items}:
            fs.makedirs(parent, exist_ok=True)
    fs.pipe(items)


def class_ids(n_classes: int, seed: int = 0) -> list[str]:
    """``n_classes`` distinct ImageNet-style WordNet ids (``n01440764``), sorted, from ``seed``."""
    rng = np.random.default_rng([seed, 1])
    ids: set[int] = set()
    while len(ids) < n_classes:
        ids.update(int(x) for x in rng.integers(1_000_000, 15_000_000, size=n_classes - len(ids)))
    return [f"n{x:08d}" for x in sorted(ids)]


# -- JPEGs ---------------------------------------------------------------------------------------

_BASE_SIZE = 1280
_NOISE_LEVELS = (4.0, 12.0, 30.0)  # pixel-noise std-dev per base image: low → high bytes per pixel
_QUALITIES = (72, 80, 87, 93)
_ASPECTS = (4 / 3, 3 / 4, 1.0, 3 / 2, 16 / 9, 2 / 3)
_MIN_SIDE, _MAX_SIDE = 160, 1200


class _JpegMaker:
    """Crops of a few noise textures, encoded to land near a requested size."""

    def __init__(self, seed: int) -> None:
        from PIL import Image

        self._Image = Image
        rng = np.random.default_rng([seed, 2])
        n = _BASE_SIZE
        self.bases = []
        for noise in _NOISE_LEVELS:
            img = np.zeros((n, n, 3), np.float32)
            weights = ((4, 1.0), (16, 0.6), (64, 0.4), (256, 0.3))
            for cells, weight in weights:
                small = (rng.random((cells, cells, 3), dtype=np.float32) * 255).astype(np.uint8)
                up = Image.fromarray(small).resize((n, n), Image.BICUBIC)
                img += weight * np.asarray(up, np.float32)
            img /= sum(w for _, w in weights)
            img += noise * rng.standard_normal((n, n, 3), dtype=np.float32)
            self.bases.append(Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)))
        # Calibrate bytes per pixel for every (base, quality) on a fixed crop.
        self.bpp: dict[tuple[int, int], float] = {}
        for b in range(len(self.bases)):
            for q in _QUALITIES:
                data = self._encode(self.bases[b].crop((0, 0, 640, 480)), q)
                self.bpp[(b, q)] = len(data) / (480 * 640)

    @staticmethod
    def _encode(img: Any, quality: int) -> bytes:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=quality)
        return buf.getvalue()

    def make(self, rng: np.random.Generator, tint: list[int], target: int) -> bytes:
        """One JPEG of roughly ``target`` bytes, always within [JPEG_MIN_BYTES, JPEG_MAX_BYTES]."""
        aspect = _ASPECTS[int(rng.integers(len(_ASPECTS)))]
        # Pick a (base, quality) for which the target size gives a plausible photo size.
        choices = []
        for (b, q), bpp in self.bpp.items():
            pixels = target / bpp
            w = math.sqrt(pixels * aspect)
            h = pixels / w
            if _MIN_SIDE <= min(w, h) and max(w, h) <= _MAX_SIDE:
                choices.append((b, q, bpp))
        if not choices:  # cannot happen with the calibrated ranges, but stay total
            choices = [min(((b, q, bpp) for (b, q), bpp in self.bpp.items()),
                           key=lambda c: abs(math.sqrt(target / c[2]) - 500))]
        b, q, bpp = choices[int(rng.integers(len(choices)))]
        flip = bool(rng.integers(2))
        oy_frac, ox_frac = rng.random(2)
        pixels = target / bpp
        data = b""
        for _ in range(6):
            w = int(min(max(math.sqrt(pixels * aspect), 16), _BASE_SIZE))
            h = int(min(max(pixels / w, 16), _BASE_SIZE))
            oy = int(oy_frac * (_BASE_SIZE - h))
            ox = int(ox_frac * (_BASE_SIZE - w))
            img = self.bases[b].crop((ox, oy, ox + w, oy + h))
            if flip:
                img = img.transpose(self._Image.Transpose.FLIP_LEFT_RIGHT)
            data = self._encode(img.point(tint), q)
            if JPEG_MIN_BYTES <= len(data) <= JPEG_MAX_BYTES:
                return data
            pixels *= target / len(data)  # rescale toward the target and try again
        raise RuntimeError(f"could not make a JPEG near {target} bytes (last {len(data)})")  # pragma: no cover

    @staticmethod
    def tint(rng: np.random.Generator) -> list[int]:
        """A per-class colour cast, as a lookup table for ``Image.point`` (256 entries a band)."""
        ramp = np.arange(256, dtype=np.float32)
        gains = 0.6 + 0.8 * rng.random(3)
        return np.concatenate([np.clip(ramp * g, 0, 255) for g in gains]).astype(np.uint8).tolist()


def _log_uniform(rng: np.random.Generator, lo: int, hi: int) -> int:
    return int(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def make_jpeg_tree(
    fs: Any,
    root: str,
    n_files: int = 2000,
    n_classes: int = 20,
    seed: int = 0,
    *,
    checksums: dict[str, str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[str]:
    """Write an ImageNet-style tree ``root/train/<wnid>/<wnid>_<k>.JPEG`` of real JPEGs.

    ``fs`` is any fsspec filesystem (``None``: local). Files are spread round-robin over
    ``n_classes`` class folders; sizes are log-uniform over ~22–285 KB and always within 20–300 KB.
    Returns the written paths (``root`` joined, sorted); fills ``checksums[path] = sha256`` if given;
    calls ``progress(files written so far)`` after each uploaded batch.
    """
    if n_files < 0 or n_classes < 1:
        raise ValueError("n_files must be >= 0 and n_classes >= 1")
    fs = _local_fs(fs)
    maker = _JpegMaker(seed)
    classes = class_ids(n_classes, seed)
    rng = np.random.default_rng([seed, 3])
    tints = [maker.tint(rng) for _ in classes]
    per_class = [0] * n_classes
    paths: list[str] = []
    batch: dict[str, bytes] = {}
    # Upload batch k in a helper thread while batch k+1 is encoded (Pillow's encoder and s3fs's
    # I/O both release the GIL); at most two batches are in memory.
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-upload") as pool:
        pending: Future | None = None
        for i in range(n_files + 1):
            if batch and (len(batch) >= _PIPE_BATCH or i == n_files):
                if pending is not None:
                    pending.result()
                    if progress is not None:
                        progress(i - len(batch))
                pending = pool.submit(_write_many, fs, batch)
                batch = {}
            if i == n_files:
                break
            c = i % n_classes
            wnid = classes[c]
            # ImageNet-like, non-consecutive image numbers within a class.
            per_class[c] += 1 + int(rng.integers(0, 40))
            path = _join(root, "train", wnid, f"{wnid}_{per_class[c]}.JPEG")
            data = maker.make(rng, tints[c], _log_uniform(rng, _TARGET_MIN, _TARGET_MAX))
            if checksums is not None:
                checksums[path] = sha256_bytes(data)
            batch[path] = data
            paths.append(path)
        if pending is not None:
            pending.result()
    return sorted(paths)


# -- Parquet -------------------------------------------------------------------------------------

_WORDS = (
    "a photo of the small large red green blue dog cat bird fish tree car house street river "
    "mountain beach field person child boat plane train bicycle flower fruit table chair window "
    "night morning sunny cloudy snow grass sand close up view near far old new bright dark"
).split()


def _parquet_table(rows: int, start_id: int, classes: list[str], rng: np.random.Generator):
    import pyarrow as pa
    import pyarrow.compute as pc

    label = rng.integers(0, len(classes), size=rows).astype(np.int16)
    image_no = rng.integers(1, 50_000, size=rows)
    wnids = pa.array(classes).take(pa.array(label.astype(np.int64)))
    image_key = pc.binary_join_element_wise(
        wnids, pc.cast(pa.array(image_no), pa.string()), "_"
    )
    words = pa.array(_WORDS)
    n_words = 6
    cols = [words.take(pa.array(rng.integers(0, len(_WORDS), size=rows))) for _ in range(n_words)]
    caption = pc.binary_join_element_wise(*cols, " ")
    emb = rng.standard_normal((rows, 4)).astype(np.float32)
    return pa.table(
        {
            "id": pa.array(np.arange(start_id, start_id + rows, dtype=np.int64)),
            "image_key": image_key,
            "label": pa.array(label),
            "label_name": wnids,
            "width": pa.array(rng.integers(160, 1200, size=rows).astype(np.int32)),
            "height": pa.array(rng.integers(160, 1200, size=rows).astype(np.int32)),
            "score": pa.array(rng.random(rows).astype(np.float32)),
            "loss": pa.array(rng.exponential(1.0, size=rows)),
            "caption": caption,
            **{f"emb_{k}": pa.array(emb[:, k]) for k in range(4)},
        }
    )


def make_parquet_files(
    fs: Any,
    root: str,
    n_files: int = 3,
    rows: int = 200_000,
    row_group_size: int = 50_000,
    seed: int = 0,
    *,
    n_classes: int = 20,
    checksums: dict[str, str] | None = None,
) -> list[str]:
    """Write ``root/part-00000.parquet`` … with ``rows`` rows each in row groups of ``row_group_size``.

    Columns: id (int64, unique across files), image_key / label_name / caption (string),
    label (int16), width / height (int32), score / emb_0..3 (float32), loss (float64).
    Returns the written paths; fills ``checksums[path] = sha256`` if given.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if rows < 1 or row_group_size < 1:
        raise ValueError("rows and row_group_size must be >= 1")
    fs = _local_fs(fs)
    classes = class_ids(n_classes, seed)
    rng = np.random.default_rng([seed, 4])
    paths = []
    for i in range(n_files):
        table = _parquet_table(rows, i * rows, classes, rng)
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, row_group_size=row_group_size, compression="snappy")
        data = sink.getvalue().to_pybytes()
        del table, sink
        path = _join(root, f"part-{i:05d}.parquet")
        if checksums is not None:
            checksums[path] = sha256_bytes(data)
        _write_many(fs, {path: data})
        paths.append(path)
    return paths


# -- WebDataset tar shard ------------------------------------------------------------------------

class _HashingWriter:
    """A write-only file object that hashes what passes through it and hands it, in chunks of
    ``chunk`` bytes, to a helper thread that writes it to ``f``. The generator (tarfile + JPEG
    encoding) and the upload (s3fs flushing a multipart part) so overlap; at most ``depth`` chunks
    wait in between, which bounds memory."""

    def __init__(self, f: Any, chunk: int = 4 << 20, depth: int = 4) -> None:
        self._f = f
        self._chunk = chunk
        self._buf = bytearray()
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._drain, name="demo-writer", daemon=True)
        self._thread.start()
        self.sha = hashlib.sha256()
        self.size = 0

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is None:
                try:
                    self._f.write(item)
                except BaseException as e:  # reported to the producer on its next write/close
                    self._error = e

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def write(self, data: bytes) -> int:
        self._check()
        self.sha.update(data)
        self.size += len(data)
        self._buf += data
        if len(self._buf) >= self._chunk:
            self._queue.put(bytes(self._buf))
            self._buf.clear()
        return len(data)

    def tell(self) -> int:
        return self.size

    def close(self) -> None:
        """Flush what is buffered and wait for the writer thread (does not close ``f``)."""
        if self._thread.is_alive():
            if self._buf and self._error is None:
                self._queue.put(bytes(self._buf))
                self._buf.clear()
            self._queue.put(None)
            self._thread.join()
        self._check()


def _tar_members(seed: int, n_classes: int) -> Iterator[tuple[str, bytes]]:
    maker = _JpegMaker(seed)
    rng = np.random.default_rng([seed, 5])
    tints = [maker.tint(rng) for _ in range(n_classes)]
    i = 0
    while True:
        label = int(rng.integers(n_classes))
        jpg = maker.make(rng, tints[label], _log_uniform(rng, _TARGET_MIN, _TARGET_MAX))
        yield f"sample{i:06d}.jpg", jpg
        yield f"sample{i:06d}.cls", f"{label}\n".encode()
        i += 1


def make_tar_shard(
    fs: Any,
    path: str,
    size_bytes: int = DEFAULT_SHARD_BYTES,
    seed: int = 0,
    *,
    n_classes: int = 20,
    checksums: dict[str, str] | None = None,
) -> str:
    """Stream a WebDataset shard of at least ``size_bytes`` to ``path``; return ``path``.

    Members come in pairs per sample key: ``sample000000.jpg`` (a real JPEG, 20–300 KB) then
    ``sample000000.cls`` (the class index as text). Written through ``fs.open(path, "wb")`` with
    :mod:`tarfile` in stream mode, so memory stays at one member plus the filesystem's write buffer.
    Fills ``checksums[path] = sha256`` if given.
    """
    fs = _local_fs(fs)
    if _is_local(fs):
        fs.makedirs(posixpath.dirname(str(path)), exist_ok=True)
    raw = fs.open(path, "wb")
    out = _HashingWriter(raw)
    try:
        tar = tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT)
        members = _tar_members(seed, n_classes)
        while True:
            for _ in range(2):  # whole samples only: .jpg and .cls together
                name, data = next(members)
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mtime = _FIXED_MTIME
                info.mode = 0o644
                info.uname = info.gname = ""
                tar.addfile(info, io.BytesIO(data))
            if tar.offset >= size_bytes:  # bytes of members so far; end blocks add more
                break
        tar.close()
        out.close()
        raw.close()
    except BaseException:
        # Leave no truncated shard behind: stop the writer, close, delete.
        for cleanup in (out.close, raw.close, lambda: fs.rm(path)):
            try:
                cleanup()
            except Exception:
                pass
        raise
    if checksums is not None:
        checksums[str(path)] = out.sha.hexdigest()
    return str(path)


# -- local extras --------------------------------------------------------------------------------

def make_local_extras(
    root: str | os.PathLike,
    *,
    classes: list[str] | None = None,
    images: Iterable[str] | None = None,
    seed: int = 0,
    checksums: dict[str, str] | None = None,
) -> list[str]:
    """Write a few small metadata files under the local directory ``root``; return their paths.

    ``classes.txt`` (one wnid per line), ``labels.csv`` (index,wnid,name), ``README``,
    ``meta/dataset.json`` and ``splits/{train,val}.txt``. ``images`` (paths relative to the
    ImageNet root, e.g. ``train/n0…/x.JPEG``) fill the splits; ``classes`` default to 20 wnids.
    """
    root = os.fspath(root)
    classes = list(classes) if classes is not None else class_ids(20, seed)
    images = sorted(images) if images is not None else []
    rng = np.random.default_rng([seed, 6])
    names = [f"{_WORDS[int(a)]}_{_WORDS[int(b)]}" for a, b in rng.integers(0, len(_WORDS), (len(classes), 2))]
    val = {p for p in images if rng.random() < 0.1}

    labels = io.StringIO()
    w = csv.writer(labels, lineterminator="\n")
    w.writerow(["index", "wnid", "name"])
    for i, (wnid, name) in enumerate(zip(classes, names)):
        w.writerow([i, wnid, name])
    files = {
        "README": (
            "datacache demo dataset\n"
            "======================\n\n"
            "/s3/imagenet   ImageNet-style JPEG tree (train/<wnid>/<wnid>_<n>.JPEG)\n"
            "/s3/parquet    tabular features, several row groups per file\n"
            "/s3/shards     WebDataset tar shards (sampleNNNNNN.jpg + .cls)\n"
            "/local         this directory: labels, class list, splits\n"
        ),
        "classes.txt": "".join(f"{c}\n" for c in classes),
        "labels.csv": labels.getvalue(),
        "meta/dataset.json": json.dumps(
            {"name": "demo", "seed": seed, "classes": len(classes), "images": len(images)},
            indent=2, sort_keys=True,
        ) + "\n",
        "splits/train.txt": "".join(f"{p}\n" for p in images if p not in val),
        "splits/val.txt": "".join(f"{p}\n" for p in images if p in val),
    }
    paths = []
    for rel, text in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = text.encode()
        with open(path, "wb") as f:
            f.write(data)
        if checksums is not None:
            checksums[path] = sha256_bytes(data)
        paths.append(path)
    return paths


# -- the demo dataset ----------------------------------------------------------------------------

def build_demo_dataset(
    s3fs_obj: Any,
    bucket: str,
    local_root: str | os.PathLike,
    *,
    n_jpeg: int = 2000,
    n_classes: int = 20,
    n_parquet: int = 3,
    parquet_rows: int = 200_000,
    row_group_size: int = 50_000,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, str]:
    """Fill ``s3://bucket`` and ``local_root`` with the demo dataset; return {dataset path: sha256}.

    Layout (the demo Dataset mounts the bucket at ``/s3`` and ``local_root`` at ``/local``)::

        s3://bucket/imagenet/train/<wnid>/<wnid>_<n>.JPEG   -> s3/imagenet/train/...
        s3://bucket/parquet/part-0000N.parquet              -> s3/parquet/...
        s3://bucket/shards/shard-000000.tar                 -> s3/shards/shard-000000.tar
        local_root/{README,classes.txt,labels.csv,...}      -> local/...

    Dataset paths have no leading slash. The bucket is created if missing. Small values of the
    keyword arguments make a tiny copy for tests (e.g. ``n_jpeg=40, shard_bytes=8 << 20``).
    ``progress(line)`` is called as the parts are written (a line for a person to read).
    """
    say = progress or (lambda line: None)
    bucket = bucket.strip("/")
    if bucket.startswith("s3://"):  # pragma: no cover - tolerate either spelling
        bucket = bucket[5:]
    try:
        s3fs_obj.mkdir(bucket)
    except FileExistsError:
        pass
    local_root = os.fspath(local_root)
    os.makedirs(local_root, exist_ok=True)

    sums: dict[str, str] = {}
    jpegs = make_jpeg_tree(s3fs_obj, f"{bucket}/imagenet", n_jpeg, n_classes, seed, checksums=sums,
                           progress=lambda n: say(f"JPEGs: {n}/{n_jpeg} encoded and uploaded"))
    say(f"JPEGs: {n_jpeg}/{n_jpeg} encoded and uploaded; writing {n_parquet} Parquet files")
    make_parquet_files(s3fs_obj, f"{bucket}/parquet", n_parquet, parquet_rows, row_group_size, seed,
                       n_classes=n_classes, checksums=sums)
    say(f"Parquet files written; writing a {shard_bytes >> 20} MiB tar shard")
    make_tar_shard(s3fs_obj, f"{bucket}/shards/shard-000000.tar", shard_bytes, seed,
                   n_classes=n_classes, checksums=sums)
    s3fs_obj.invalidate_cache(bucket)

    out: dict[str, str] = {}
    for path, digest in sums.items():
        out["s3/" + path[len(bucket) + 1:]] = digest
    prefix = f"{bucket}/imagenet/"
    local_sums: dict[str, str] = {}
    make_local_extras(
        local_root,
        classes=class_ids(n_classes, seed),
        images=[p[len(prefix):] for p in jpegs],
        seed=seed,
        checksums=local_sums,
    )
    for path, digest in local_sums.items():
        rel = os.path.relpath(path, local_root).replace(os.sep, "/")
        out["local/" + rel] = digest
    return dict(sorted(out.items()))
