"""``datacache demo``: the main job end to end on one machine.

1. start moto's S3 server on loopback and fill a bucket with a realistic training set (JPEG tree,
   Parquet files, a >= 256 MiB WebDataset tar shard) plus a local directory;
2. apply ``examples/demo-dataset.yaml`` (two mounts in one namespace, a MEM+SSD CacheRuntime);
3. ``datacache warmup`` with a live progress bar;
4. read every file back through ``datacache://`` and through a FUSE mount (``datacache mount
   --background``) with real clients (Pillow decodes the JPEGs, pyarrow reads the Parquet files,
   tarfile walks the shard), compare every byte by sha256, print the status table and cold
   (S3 direct) vs warm (cache, mount) read throughput.

Everything lives in a temporary directory removed at the end (``--keep`` keeps it); the exit status
is non-zero if any check fails.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import string
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import resources

import click
import fsspec
import pyarrow.parquet as pq
from PIL import Image

from datacache.api.loader import load_resources
from datacache.api.quantity import format_bytes
from datacache.cli.warmupbar import run_warmup
from datacache.cli.tables import table
from datacache.control.embedded import Embedded
from datacache.demo.sample_data import build_demo_dataset
from datacache.demo.s3server import DUMMY_KEY, DUMMY_SECRET, MotoServer
from datacache.ufs.credentials import env_name

BUCKET = "demo-bucket"


def _step(text: str) -> None:
    click.secho(f"==> {text}", bold=True)


def _decode(open_file, path: str) -> None:
    """Decode with the format's real client, reading through ``open_file(path)``; raises on a
    malformed file."""
    with open_file(path) as f:
        if path.endswith(".JPEG"):
            with Image.open(f) as img:
                img.load()
        elif path.endswith(".parquet"):
            pf = pq.ParquetFile(f)
            pf.read()
            if pf.num_row_groups < 2:
                raise ValueError(f"{path}: expected several row groups, found {pf.num_row_groups}")
        elif path.endswith(".tar"):
            with tarfile.open(fileobj=f) as tar:
                if not tar.getmembers():
                    raise ValueError(f"{path}: empty tar shard")


def _every(seconds: float, say):
    """``say`` wrapped to pass on at most one line every ``seconds`` (a long step shows it is alive)."""
    last = [time.monotonic()]

    def throttled(line: str) -> None:
        if time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            say(line)
    return throttled


def _verify(label: str, sums: dict[str, str], read, open_file) -> list[str]:
    """Check every file's sha256 through ``read(path)`` and decode it through ``open_file``; says
    how far it got every 5 seconds."""
    failures = []
    say = _every(5.0, lambda line: click.echo(f"    {label}: {line}"))
    for n, (path, digest) in enumerate(sums.items()):
        say(f"{n}/{len(sums)} files checked")
        if hashlib.sha256(read(path)).hexdigest() != digest:
            failures.append(f"{label}: {path}: checksum mismatch")
            continue
        try:
            _decode(open_file, path)
        except Exception as err:  # a decoder's own error type
            failures.append(f"{label}: {path}: {type(err).__name__}: {err}")
    click.echo(f"    {label}: {len(sums) - len(failures)}/{len(sums)} files verified "
               "(JPEGs decoded by Pillow, Parquet read by pyarrow, the shard walked by tarfile)")
    return failures


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "datacache", *args], check=True, timeout=120)


def _read_local(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _throughput(read_all, paths) -> tuple[float, int]:
    t0 = time.perf_counter()
    n = sum(len(read_all(p)) for p in paths)
    return n / (time.perf_counter() - t0), n


JPEG_SAMPLE = 5  # throughput of every 5th JPEG: the same ratio, a fifth of the cold s3fs wait


def _groups(sums: dict[str, str]) -> list[tuple[str, list[str]]]:
    jpegs = [p for p in sums if p.endswith(".JPEG")]
    return [(f"{len(jpegs[::JPEG_SAMPLE])} JPEGs", jpegs[::JPEG_SAMPLE]),
            ("tar shard", [p for p in sums if p.endswith(".tar")])]


def run_demo(n_jpeg: int = 2000, shard_bytes: int = 256 << 20, keep: bool = False) -> int:
    """Run the demo; returns the process exit status (0 when every check passed)."""
    work = tempfile.mkdtemp(prefix="datacache-demo-")
    os.chmod(work, 0o700)
    home, local_dir = os.path.join(work, "home"), os.path.join(work, "local")
    saved_env = {k: os.environ.get(k) for k in ("DATACACHE_HOME",)}
    os.environ["DATACACHE_HOME"] = home
    failures: list[str] = []
    try:
        with MotoServer() as s3:
            _step(f"S3 endpoint on loopback: {s3.endpoint_url}; generating the training set")
            t0 = time.perf_counter()
            sums = build_demo_dataset(s3.s3fs(), BUCKET, local_dir, n_jpeg=n_jpeg, shard_bytes=shard_bytes,
                                      progress=_every(5.0, lambda line: click.echo(f"    {line}")))
            click.echo(f"    {len(sums)} files, generated and uploaded in {time.perf_counter() - t0:.1f}s")

            os.environ[env_name("demo-s3", "access-key")] = DUMMY_KEY
            os.environ[env_name("demo-s3", "secret-key")] = DUMMY_SECRET
            template = resources.files("datacache.demo").joinpath("demo-dataset.yaml").read_text()
            yaml_path = os.path.join(work, "dataset.yaml")
            with open(yaml_path, "w") as f:
                f.write(string.Template(template).safe_substitute(S3_ENDPOINT=s3.endpoint_url, LOCAL_DIR=local_dir))
            _step(f"datacache apply -f {yaml_path}")
            plane = Embedded(home)
            for line in plane.apply(load_resources(yaml_path)):
                click.echo(f"    {line}")

            _step("datacache warmup demo")
            if run_warmup(plane, "demo", []) != 0:
                failures.append("warmup did not complete")

            _step("reading every file back through datacache:// and checking sha256")
            fs = fsspec.filesystem("datacache", home=home, skip_instance_cache=True)
            failures += _verify("datacache://", sums, lambda p: fs.cat_file(f"demo/{p}"),
                                lambda p: fs.open(f"demo/{p}"))

            mnt = os.path.join(work, "mnt")
            os.mkdir(mnt)
            _step(f"datacache mount demo {mnt} --background; reading every file through the mount")
            _cli("mount", "demo", mnt, "--background", "--home", home)
            try:
                failures += _verify("FUSE mount", sums, lambda p: _read_local(os.path.join(mnt, p)),
                                    lambda p: open(os.path.join(mnt, p), "rb"))
                mount_rates = {label: _throughput(lambda p: _read_local(os.path.join(mnt, p)), group)[0]
                               for label, group in _groups(sums)}
            finally:
                _cli("unmount", mnt, "--home", home)

            _step("cold (S3 direct, s3fs) vs warm (datacache://) read throughput")
            direct = s3.s3fs()
            for label, group in _groups(sums):
                cold, n = _throughput(lambda p: direct.cat_file(f"{BUCKET}/{p[3:]}"), group)
                warm, _ = _throughput(lambda p: fs.cat_file(f"demo/{p}"), group)
                click.echo(f"    {label:<10} {format_bytes(n):>10}: cold {format_bytes(cold)}/s, warm "
                           f"datacache:// {format_bytes(warm)}/s ({warm / cold:.1f}x), warm FUSE mount "
                           f"{format_bytes(mount_rates[label])}/s ({mount_rates[label] / cold:.1f}x)")
            fs.close()

            _step("datacache get datasets -o wide; datacache get runtimes")
            click.echo(table("Dataset", plane.list("Dataset"), wide=True))
            click.echo(table("CacheRuntime", plane.list("CacheRuntime")))
            status = plane.state.get("Dataset", "demo")["status"]
            if status["cacheStates"]["cachedPercentage"] != "100.0%":
                failures.append(f"cachedPercentage is {status['cacheStates']['cachedPercentage']}, not 100.0%")
            plane.close()
    finally:
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if keep:
            click.echo(f"state kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    if failures:
        click.secho(f"demo FAILED: {len(failures)} problem(s)", fg="red", bold=True)
        for f in failures[:20]:
            click.echo(f"  - {f}")
        return 1
    click.secho("demo OK: every byte verified", fg="green", bold=True)
    return 0
