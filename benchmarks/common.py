"""Shared setup for the benchmarks: the demo dataset on loopback, runtimes, timing and tables.

``DemoEnvironment`` is a context manager that, inside one temporary directory it removes at the
end:

- starts moto's S3 server as a child process on 127.0.0.1 (``datacache.demo.s3server``; ``s3_ranges``:
  ``"stored"`` serves a ranged GET from the stored object's range, as S3 does, ``"moto"`` is stock
  moto, which reads the whole object for each ranged GET),
- optionally (``latency_ms`` / ``bandwidth_mbps`` not None) puts a delay/bandwidth proxy in front
  of it (``benchmarks.proxy.DelayProxy``), so that it behaves like a remote object store: the
  Dataset's endpoint, ``storage_options()`` and ``s3fs()`` then go through the proxy, while the
  dataset itself is built straight into moto (building is not what is measured),
- builds the demo dataset with ``datacache.demo.sample_data.build_demo_dataset`` (JPEG tree, Parquet
  files, one WebDataset tar shard in the bucket; a few files in a local directory),
- optionally (``http=True``) serves a copy of the bucket's files with nginx
  (``benchmarks.nginx.NginxServer``: an HTTP source with real range support) behind a second
  ``DelayProxy`` with the same settings (``http_url``); ``new_home(source="http")`` then gives a
  Dataset whose one mount is that URL (``mountPoint: http://...``, at ``path: /http``),
- renders ``datacache/demo/demo-dataset.yaml`` for that endpoint and directory, and variants of it
  with another CacheRuntime (``runtime_yaml``), e.g. an SSD-only tiered store,
- hands out fresh ``DATACACHE_HOME`` directories with the Dataset and a runtime applied
  (``new_home``), each with its own cache directory, so runs never share cached blocks.

``$DATACACHE_HOME`` and the demo secret's environment variables are set for the duration and
restored afterwards. The moto server is stopped (and reaped) on exit, also on an exception.

Timing helpers keep every sample and report the median or the best; ``format_table`` prints plain
aligned text so output can be pasted into an issue.
"""

from __future__ import annotations

import os
import resource
import shutil
import string
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib import resources as importlib_resources

import yaml

from benchmarks.nginx import NginxServer
from benchmarks.proxy import DelayProxy
from datacache.api.loader import load_resources
from datacache.control.embedded import Embedded
from datacache.demo.sample_data import build_demo_dataset, sha256_bytes
from datacache.demo.s3server import DUMMY_KEY, DUMMY_SECRET, MotoServer
from datacache.ufs.credentials import env_name

__all__ = [
    "BUCKET",
    "DATASET",
    "MB",
    "DemoEnvironment",
    "Sample",
    "cpu_seconds",
    "format_table",
    "peak_rss_mib",
    "sha256_bytes",
    "spread",
    "summarize",
    "timed",
]

BUCKET = "demo-bucket"
DATASET = "demo"
MB = 1_000_000  # throughput is printed in MB/s = 10^6 bytes per second

#: CacheRuntime variants by name: which of the demo YAML's ``tieredstore.levels`` each keeps
#: ("ssd-only" is the demo's runtime without its MEM level: same SSD quota, watermarks, blockSize).
RUNTIME_LEVELS: dict[str, Callable[[dict], bool]] = {
    "default": lambda level: True,
    "ssd-only": lambda level: level["mediumtype"] == "SSD",
}


# -- timing --------------------------------------------------------------------------------------

@dataclass
class Sample:
    """One timed pass: wall ``seconds``, ``nbytes`` moved, ``files`` touched."""

    seconds: float
    nbytes: int
    files: int
    cpu: float = 0.0  # CPU seconds of this process (all threads) during the pass
    server_cpu: float | None = None  # CPU seconds of the server process, when one was named

    @property
    def mb_s(self) -> float:
        return self.nbytes / self.seconds / MB if self.seconds > 0 else float("inf")

    @property
    def files_s(self) -> float:
        return self.files / self.seconds if self.seconds > 0 else float("inf")


def cpu_seconds(pid: int | None = None) -> float | None:
    """User + system CPU seconds of this process (``pid`` None) or of process ``pid`` (Linux
    ``/proc``; None when it cannot be read)."""
    if pid is None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def timed(fn: Callable[[], tuple[int, int]], server_pid: int | None = None) -> Sample:
    """Run ``fn`` (returning ``(bytes, files)``) once and time it with ``perf_counter``; also
    count this process's CPU time and, given ``server_pid``, that server's."""
    s0, c0 = cpu_seconds(server_pid) if server_pid else None, cpu_seconds()
    t0 = time.perf_counter()
    nbytes, files = fn()
    seconds = time.perf_counter() - t0
    s1 = cpu_seconds(server_pid) if server_pid else None
    server = s1 - s0 if s0 is not None and s1 is not None else None
    return Sample(seconds, nbytes, files, cpu_seconds() - c0, server)


def summarize(samples: list[Sample], stat: str = "median") -> Sample:
    """The median (by time; the lower middle for an even count) or the best (fastest) sample."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples, key=lambda s: s.seconds)
    if stat == "best":
        return ordered[0]
    if stat == "median":
        return ordered[(len(ordered) - 1) // 2]
    raise ValueError(f"unknown statistic {stat!r} (best, median)")


def spread(samples: list[Sample]) -> str:
    """``min–max MB/s`` over the samples, to show how noisy a figure is."""
    rates = [s.mb_s for s in samples]
    return f"{min(rates):.0f}-{max(rates):.0f}" if len(rates) > 1 else f"{rates[0]:.0f}"


# -- output --------------------------------------------------------------------------------------

def format_table(headers: list[str], rows: Iterable[list[str]], right: Iterable[int] = ()) -> str:
    """Plain text table; columns whose index is in ``right`` are right-aligned."""
    rows = [[str(c) for c in r] for r in rows]
    right = set(right)
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), sep] + [line(r) for r in rows])


def peak_rss_mib() -> tuple[float, float]:
    """Peak resident set size in MiB of this process and of its reaped children (Linux: KiB)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, children


# -- the environment -----------------------------------------------------------------------------

@dataclass
class DemoEnvironment:
    """The demo dataset on a loopback moto S3 server, in a temporary directory (see module doc).

    ``n_jpeg`` JPEGs and a tar shard of at least ``shard_bytes`` bytes; ``keep`` leaves the
    temporary directory in place (its path is printed by the caller). ``latency_ms`` /
    ``bandwidth_mbps``: when either is not None, clients reach moto through a ``DelayProxy``
    with that first-byte latency and per-connection bandwidth (None counts as 0: none / unlimited).
    ``n_parquet`` Parquet files of ``parquet_rows`` rows in row groups of ``row_group_size`` rows.
    ``http``: also serve the bucket's files with nginx behind its own proxy (see module doc).
    ``s3_ranges``: how moto serves a ranged GET, ``"stored"`` or ``"moto"`` (``MotoServer``'s ``ranges``).
    """

    n_jpeg: int = 2000
    shard_bytes: int = 256 << 20
    keep: bool = False
    seed: int = 0
    latency_ms: float | None = None
    bandwidth_mbps: float | None = None
    n_parquet: int = 3
    parquet_rows: int = 200_000
    row_group_size: int = 50_000
    http: bool = False
    s3_ranges: str = "stored"

    work: str = field(init=False, default="")
    s3: MotoServer | None = field(init=False, default=None)
    proxy: DelayProxy | None = field(init=False, default=None)
    nginx: NginxServer | None = field(init=False, default=None)
    http_proxy: DelayProxy | None = field(init=False, default=None)
    local_dir: str = field(init=False, default="")
    sums: dict[str, str] = field(init=False, default_factory=dict)
    sizes: dict[str, int] = field(init=False, default_factory=dict)
    build_seconds: float = field(init=False, default=0.0)
    _yaml_text: str = field(init=False, default="")
    _saved_env: dict[str, str | None] = field(init=False, default_factory=dict)
    _homes: int = field(init=False, default=0)

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> DemoEnvironment:
        self.work = tempfile.mkdtemp(prefix="datacache-bench-")
        os.chmod(self.work, 0o700)
        try:
            self._setup()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _setup(self) -> None:
        env = {
            "DATACACHE_HOME": os.path.join(self.work, "home"),
            env_name("demo-s3", "access-key"): DUMMY_KEY,
            env_name("demo-s3", "secret-key"): DUMMY_SECRET,
        }
        for k, v in env.items():
            self._saved_env[k] = os.environ.get(k)
            os.environ[k] = v
        self.local_dir = os.path.join(self.work, "local-mount")
        self.s3 = MotoServer(ranges=self.s3_ranges).start()
        if self.latency_ms is not None or self.bandwidth_mbps is not None:
            self.proxy = DelayProxy(self.s3.endpoint_url, self.latency_ms or 0.0, self.bandwidth_mbps or 0.0).start()
        t0 = time.perf_counter()
        self.sums = build_demo_dataset(self.s3.s3fs(), BUCKET, self.local_dir, n_jpeg=self.n_jpeg,
                                       shard_bytes=self.shard_bytes, seed=self.seed,
                                       n_parquet=self.n_parquet, parquet_rows=self.parquet_rows,
                                       row_group_size=self.row_group_size)
        self.build_seconds = time.perf_counter() - t0
        listing = self.s3.s3fs().find(BUCKET, detail=True)
        for key, info in listing.items():
            self.sizes["s3/" + key[len(BUCKET) + 1:]] = int(info["size"])
        missing = [p for p in self.sums if p.startswith("s3/") and p not in self.sizes]
        if missing:
            raise RuntimeError(f"{len(missing)} generated files are not in the bucket, e.g. {missing[0]}")
        if self.http:
            self._serve_http()
        template = importlib_resources.files("datacache.demo").joinpath("demo-dataset.yaml").read_text()
        self._yaml_text = string.Template(template).safe_substitute(
            S3_ENDPOINT=self.endpoint_url, LOCAL_DIR=self.local_dir)

    def _serve_http(self) -> None:
        """Copy the bucket (straight from moto: not measured) to ``<work>/http-root`` and serve it
        with nginx, behind a ``DelayProxy`` when the S3 endpoint has one."""
        root = self.path("http-root")
        paths = self.files("s3/")
        local = [os.path.join(root, p[len("s3/"):]) for p in paths]
        for dst in local:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
        self.s3.s3fs().get([self.s3_key(p) for p in paths], local)
        self.nginx = NginxServer(root).start()
        if self.proxy is not None:
            self.http_proxy = DelayProxy(self.nginx.url, self.latency_ms or 0.0, self.bandwidth_mbps or 0.0).start()

    def __exit__(self, *exc: object) -> None:
        for server in (self.http_proxy, self.nginx, self.proxy):
            if server is not None:
                server.stop()
        if self.s3 is not None:
            self.s3.stop()
        for k, v in self._saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        self._saved_env.clear()
        if self.work and not self.keep:
            shutil.rmtree(self.work, ignore_errors=True)

    # -- data ------------------------------------------------------------------------------------
    def files(self, prefix: str, suffix: str = "") -> list[str]:
        """Dataset paths (``s3/...``) under ``prefix`` ending with ``suffix``, sorted."""
        return sorted(p for p in self.sizes if p.startswith(prefix) and p.endswith(suffix))

    def total_bytes(self, paths: Iterable[str]) -> int:
        return sum(self.sizes[p] for p in paths)

    @staticmethod
    def s3_key(path: str) -> str:
        """``s3/x/y`` (dataset path under the S3 mount) -> ``demo-bucket/x/y``."""
        if not path.startswith("s3/"):
            raise ValueError(f"{path!r} is not under the S3 mount")
        return f"{BUCKET}/{path[3:]}"

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint clients use: the proxy's when there is one, else moto's."""
        assert self.s3 is not None
        return self.proxy.endpoint_url if self.proxy is not None else self.s3.endpoint_url

    def storage_options(self) -> dict:
        """s3fs options for :attr:`endpoint_url` (through the proxy when there is one)."""
        assert self.s3 is not None
        return {**self.s3.storage_options(), "endpoint_url": self.endpoint_url}

    @property
    def http_url(self) -> str:
        """The HTTP source's URL (no trailing slash): the proxy's in front of nginx when there is one."""
        if self.nginx is None:
            raise RuntimeError("the environment was made without http=True")
        return self.http_proxy.endpoint_url if self.http_proxy is not None else self.nginx.url

    def http_file(self, path: str) -> str:
        """``s3/x/y`` (a dataset path of the bucket) -> the same file's URL on the HTTP source."""
        return f"{self.http_url}/{self.s3_key(path)[len(BUCKET) + 1:]}"

    def s3fs(self, **kwargs):
        """A fresh s3fs client of :attr:`endpoint_url` (through the proxy when there is one)."""
        assert self.s3 is not None
        return self.s3.s3fs(**{"endpoint_url": self.endpoint_url, **kwargs})

    def path(self, *parts: str) -> str:
        """A path inside the temporary directory."""
        return os.path.join(self.work, *parts)

    # -- runtimes and homes ----------------------------------------------------------------------
    def runtime_docs(self, runtime: str = "default", source: str = "s3") -> list[dict]:
        """The demo's Dataset + CacheRuntime documents with ``runtime``'s tiered store; for
        ``source="http"`` the Dataset's only mount is the HTTP source, at ``/http``."""
        docs = [d for d in yaml.safe_load_all(self._yaml_text) if d]
        keep = RUNTIME_LEVELS[runtime]
        for d in docs:
            if d["kind"] == "Dataset" and source == "http":
                d["spec"]["mounts"] = [{"name": "http", "mountPoint": self.http_url + "/", "path": "/http"}]
            if d["kind"] == "CacheRuntime":
                tiers = d["spec"]["tieredstore"]
                tiers["levels"] = [lv for lv in tiers["levels"] if keep(lv)]
                if not tiers["levels"]:
                    raise ValueError(f"runtime variant {runtime!r} leaves no tiered-store level")
        return docs

    def runtime_label(self, runtime: str = "default") -> str:
        """``MEM 256Mi + SSD 2Gi`` as read from the runtime's YAML (plus ``replicas`` when set)."""
        rt = next(d for d in self.runtime_docs(runtime) if d["kind"] == "CacheRuntime")
        label = " + ".join(f"{lv['mediumtype']} {lv['quota']}" for lv in rt["spec"]["tieredstore"]["levels"])
        replicas = rt["spec"].get("replicas")
        return label if replicas is None else f"{label}, replicas {replicas}"

    def block_size(self, runtime: str = "default") -> str:
        rt = next(d for d in self.runtime_docs(runtime) if d["kind"] == "CacheRuntime")
        return str(rt["spec"].get("blockSize", "default"))

    def runtime_yaml(self, runtime: str = "default", source: str = "s3") -> str:
        """Write ``runtime_docs(runtime, source)`` to ``<work>/dataset-<runtime>[-http].yaml``;
        returns the path."""
        path = self.path(f"dataset-{runtime}{'' if source == 's3' else '-' + source}.yaml")
        with open(path, "w") as f:
            yaml.safe_dump_all(self.runtime_docs(runtime, source), f, sort_keys=False)
        return path

    def new_home(self, runtime: str = "default", source: str = "s3") -> tuple[str, Embedded]:
        """A fresh ``DATACACHE_HOME`` with the Dataset of ``source`` (s3: the demo's; http: the
        HTTP source) and ``runtime`` applied (metadata synced). Returns ``(home, control plane)``;
        close the plane when done."""
        self._homes += 1
        home = self.path(f"home-{runtime}-{self._homes}")
        plane = Embedded(home)
        plane.apply(load_resources(self.runtime_yaml(runtime, source)))
        return home, plane


# -- peers' configuration files ------------------------------------------------------------------

def write_private(path: str, text: str) -> str:
    """Write ``text`` to ``path`` created 0600 (it holds credentials); returns ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "w") as f:
        f.write(text)
    return path


def rclone_s3_config(path: str, remote: str, region: str) -> str:
    """An rclone config (0600) with one S3 remote named ``remote`` (provider Other, path-style,
    the moto server's dummy keys); the endpoint is given on the command line. Returns ``path``."""
    return write_private(path, f"[{remote}]\ntype = s3\nprovider = Other\nenv_auth = false\n"
                               f"access_key_id = {DUMMY_KEY}\nsecret_access_key = {DUMMY_SECRET}\n"
                               f"region = {region}\nforce_path_style = true\n")


def s3fs_fuse_passwd(path: str) -> str:
    """An s3fs-fuse ``passwd_file`` (0600) with the moto server's dummy keys. Returns ``path``."""
    return write_private(path, f"{DUMMY_KEY}:{DUMMY_SECRET}\n")
