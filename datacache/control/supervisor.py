"""Embedded supervision of cache workers: N worker processes per CacheRuntime on this machine.

A CacheRuntime with ``replicas`` >= 2 runs as worker processes; with 0 or 1 the cache stays in the
reading process (today's LocalBlockSource, the "local worker"), which is the fastest choice on one
node. For a distributed runtime, one *supervisor* daemon per runtime (``datacache worker
supervise``) converges, like a Kubernetes controller, on what the state database says:

- every ``poll_s`` it reads the CacheRuntime (and its Dataset) from ``$DATACACHE_HOME/state.db``;
- it starts worker ``i`` for each index ``i`` of the runtime's worker set (``replicas`` indexes,
  see :mod:`datacache.cluster.workerset`) that is not running (``datacache worker serve``, cache in
  ``<level path>/<ns>/<name>/worker-<i>``, port ``spec.worker.port + i`` or any free one),
  restarting crashed ones with a capped backoff, and restarting workers whose spec changed;
- it stops workers whose index left the set (scale-in stops the workers the control plane named,
  the least hot ones), after draining them (:meth:`Supervisor._drain`), and everything when the
  runtime is deleted or drops back to one replica, then exits.

Scale-in to two or more workers drains before it stops, as Alluxio decommissions a worker: the
leaving workers are taken out of the members placement ranks (``Membership.drain``), so new reads
and warmups go to the workers that stay (which copy a block still on a leaving worker by
read-repair), then each leaving worker hands every block of the dataset's current files to its
new HRW owner (``POST /v1/drain``, :meth:`datacache.cluster.peers.Peers.drain`: checksums verified,
its copy dropped once the owner holds it) for at most :func:`drain_timeout` seconds (60, or
``$DATACACHE_DRAIN_TIMEOUT_S`` of the command that started the supervisor), and only then is it
stopped. Each report (blocks moved, left and why, seconds) is logged and kept in
``drain-worker-<i>.json`` until :func:`converge` shows it (``datacache scale`` prints it). The
leaving worker's cache directory is kept: it holds only what could not be moved (and blocks of old
file versions, which no read asks for), is used again if that index comes back (its hand-off then
moves what is left), and is removed with the runtime. A worker that is not running when it leaves
the set is not drained: its blocks stay in its directory, as before.

Scaling out from one replica keeps the cache: before it starts any worker, the supervisor makes the
in-process cache directory (``<level path>/<ns>/<name>``) the first worker's without a cache of its
own (each entry renamed into ``worker-<i>/``, no byte copied); the workers' hand-off then
moves each block to its HRW owner, and until then owners find them by read-repair
(:mod:`datacache.cluster.peers`). A process still reading through the in-process cache when the
runtime is scaled out should be restarted (the dataset's next open uses the workers). Scaling back
to one replica does the reverse (:func:`return_cache`): one worker's directory (the first of the
set, or the one the control plane kept) becomes the in-process cache again, and every other
worker's blocks of current files are copied into it, checksums verified, within the high watermark
of its quota (:func:`merge_caches`); ``datacache scale`` prints what was copied, and what was left
in a worker's directory and why.

On Kubernetes an orchestrator runs the workers (the operator's StatefulSet or DaemonSet) and DNS
lists them (``DATACACHE_MEMBERSHIP=dns``, :func:`external_workers`): a runtime with ``replicas`` >= 1
reads through them, and this module starts, scales and stops nothing there (no supervisor, no pid
files).

So ``apply`` and ``scale`` only write the desired state and wait for readiness; the daemon and the
workers survive the CLI that started them (own session, stdin closed, output to
``$DATACACHE_HOME/logs/<ns>.<name>.<process>.log``). Pid files under
``$DATACACHE_HOME/runtimes/<ns>/<name>/`` hold ``pid starttime``, so a recycled pid is never
mistaken for a worker. Workers exit on their own if the supervisor dies (they watch their parent),
and :func:`stop` kills any that remain, so no stray process outlives ``datacache delete``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from datacache import private
from datacache.cache.disk import holds_cache
from datacache.cluster.auth import ensure_token, load_token, runtime_dir
from datacache.cluster import membership, merge
from datacache.cluster.membership import Membership
from datacache.cluster import workerset
from datacache.stack import layout, readpath
from datacache.errors import ConfigError

log = logging.getLogger("datacache.supervisor")

READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
DRAIN_TIMEOUT_S = 60  # seconds a leaving worker may spend handing its blocks off (default)
DRAIN_ENV = "DATACACHE_DRAIN_TIMEOUT_S"
_BACKOFF_MAX_S = 30.0
_REAP_S = 5.0


def wait_until(predicate, timeout: float, interval: float = 0.05):
    """Poll ``predicate()`` until it returns something true (returned) or ``timeout`` seconds
    pass (returns the last, false, value)."""
    deadline = time.monotonic() + timeout
    while not (value := predicate()) and time.monotonic() < deadline:
        time.sleep(interval)
    return value


def drain_timeout() -> int:
    """Seconds a leaving worker may spend handing its blocks off: ``$DATACACHE_DRAIN_TIMEOUT_S``
    (a whole number from 1 to 86400), else ``DRAIN_TIMEOUT_S``. Raises ``ConfigError`` naming the
    variable for any other value."""
    raw = os.environ.get(DRAIN_ENV, "")
    if not raw:
        return DRAIN_TIMEOUT_S
    if raw.isdigit() and 1 <= int(raw) <= 86400:
        return int(raw)
    raise ConfigError("environment", [(DRAIN_ENV, f"{raw[:40]!r} is not a whole number of seconds from 1 to 86400 "
                                                  f"(unset it for the default, {DRAIN_TIMEOUT_S})")])


def external_workers() -> bool:
    """Whether an orchestrator (Kubernetes: the operator's StatefulSet or DaemonSet) runs the
    workers and DNS lists them (``DATACACHE_MEMBERSHIP=dns``, see
    :func:`datacache.cluster.membership.external`): then this plane starts and stops none.
    Raises ``ConfigError`` for an unknown ``DATACACHE_MEMBERSHIP``."""
    return membership.external()


# -- pid files ---------------------------------------------------------------------------------------
def _start_time(pid: int) -> int | None:
    """The kernel start time of a running (not zombie) ``pid``, or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def write_pid(path: str, pid: int) -> None:
    private.makedirs(os.path.dirname(path))
    with open(private.touch(path + ".tmp"), "w") as f:
        f.write(f"{pid} {_start_time(pid) or 0}\n")
    os.replace(path + ".tmp", path)


def read_pid(path: str) -> int | None:
    """The pid in ``path`` if that very process still runs, else None."""
    try:
        with open(path) as f:
            pid, started = (int(x) for x in f.read().split())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _start_time(pid) == started else None


def _kill(pid: int, timeout: float) -> None:
    """SIGTERM ``pid``, wait up to ``timeout`` s for it to go, then SIGKILL it (and wait up to
    ``_REAP_S`` s for the kernel to finish it)."""
    started = _start_time(pid)
    if started is None:
        return
    _signal(pid, signal.SIGTERM)
    if not wait_until(lambda: _start_time(pid) != started, timeout):
        _signal(pid, signal.SIGKILL)
        wait_until(lambda: _start_time(pid) != started, _REAP_S)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _paths(home: str, namespace: str, name: str) -> tuple[str, str]:
    """``(runtime dir, log file prefix)``."""
    return runtime_dir(home, namespace, name), os.path.join(home, "logs", f"{namespace}.{name}")


def _spawn(argv: list[str], log_path: str, **kwargs) -> subprocess.Popen:
    private.makedirs(os.path.dirname(log_path))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, private.FILE_MODE)
    try:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
                                close_fds=True, **kwargs)
    finally:
        os.close(fd)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "datacache", *args]


# -- what the CLI and the embedded plane call ---------------------------------------------------------
def ensure_running(home: str, namespace: str, name: str, timeout: float = 15.0) -> bool:
    """Start the runtime's supervisor daemon unless it runs (or the workers are external: never);
    True when it had to be started. Raises ``TimeoutError`` when it did not come up within
    ``timeout`` seconds."""
    if external_workers():
        return False
    rdir, logs = _paths(home, namespace, name)
    pid_path = os.path.join(rdir, "supervisor.pid")
    if read_pid(pid_path) is not None:
        return False
    ensure_token(home, namespace, name)
    _spawn(_cli("worker", "supervise", name, "-n", namespace, "--home", home), logs + ".supervisor.log",
           start_new_session=True, cwd=home)
    if wait_until(lambda: read_pid(pid_path), timeout) is None:
        raise TimeoutError(f"the supervisor of cacheruntime {namespace}/{name} did not start: see "
                           f"{logs}.supervisor.log")
    return True


def ensure_workers(home: str, runtime) -> None:
    """Start the supervisor of ``runtime``'s workers again if it is not running (after a reboot,
    say; never for external workers) and wait for them: the read path's ``ensure_workers`` hook
    (see :mod:`datacache.stack.readpath`)."""
    ns, name = runtime.metadata.namespace, runtime.metadata.name
    if ensure_running(home, ns, name):
        wait_ready(home, ns, name, runtime.spec.replicas)


def wait_ready(home: str, namespace: str, name: str, replicas: int, timeout: float = READY_TIMEOUT_S) -> bool:
    """Wait until exactly the workers of the runtime's worker set (``replicas`` indexes, see
    :mod:`datacache.cluster.workerset`) are live and no worker is being drained; False after ``timeout`` seconds
    (plus the drain's bound while one is being drained)."""
    want = {f"worker-{i}" for i in workerset.desired(home, namespace, name, replicas)}
    members = Membership(home)

    def ready() -> bool:  # leaving workers stopped, not just out of placement
        return {m.worker_id for m in members.live(namespace, name)} == want and not members.draining(namespace, name)

    try:
        if wait_until(ready, timeout, 0.1):
            return True
        # A drain is bounded by drain_timeout(); its worker stops within STOP_TIMEOUT_S after.
        return bool(members.draining(namespace, name)) and wait_until(ready, drain_timeout() + STOP_TIMEOUT_S, 0.1)
    finally:
        members.close()


def converge(home: str, runtime, timeout: float = READY_TIMEOUT_S) -> str:
    """Make the processes match ``runtime`` (stored already): start/keep its supervisor and wait for
    its workers, or stop them for an in-process runtime (whose cache becomes one worker's again, see
    :func:`return_cache`, with the other workers' blocks copied in, :func:`merge_caches`). External
    workers are the orchestrator's to start, scale and stop: nothing is done. Returns '' or notes
    in parentheses: the drain or copy reports, readiness."""
    if external_workers():
        return ""
    ns, name = runtime.metadata.namespace, runtime.metadata.name
    drain_timeout()  # a wrong value fails here, in the command, not later in the daemon
    if not readpath.distributed(runtime):
        kept = workerset.plan(1, workerset.read(home, ns, name))[0]
        stop(home, ns, name)
        return_cache(home, runtime, kept)
        lines = merge_caches(home, runtime)
        workerset.forget(home, ns, name)
        return "".join(f" ({line})" for line in lines)
    indexes = workerset.desired(home, ns, name, runtime.spec.replicas)
    workerset.write(home, ns, name, indexes)
    ensure_running(home, ns, name)
    ok = wait_ready(home, ns, name, runtime.spec.replicas, timeout)
    drained = "".join(f" ({line})" for line in take_drain_reports(home, ns, name, indexes))
    if ok:
        return drained
    members = Membership(home)
    ready = len(members.live(ns, name))
    members.close()
    return f"{drained} ({ready}/{runtime.spec.replicas} workers ready; see 'datacache get runtimes')"


def drain_summary(worker: str, report: dict) -> str:
    """One line for the report of a drain (see :meth:`datacache.cluster.peers.Peers.drain`):
    ``drained worker-2: 70/70 blocks handed to their new owners in 1.2s`` plus what was left and
    why."""
    if "error" in report:
        return f"drained {worker}: failed: {report['error']}; its blocks stay in its cache directory"
    line = f"drained {worker}: {report['moved']}/{report['blocks']} blocks handed to their new owners in " \
           f"{report['seconds']:.1f}s"
    if report.get("left"):
        why = "; ".join(f"{owner}: {text}" for owner, text in sorted(report.get("errors", {}).items()))
        line += f"; {report['left']} left in its cache directory ({why})"
    if report.get("stale"):
        line += f"; {report['stale']} blocks of old file versions not moved"
    return line


def take_drain_reports(home: str, namespace: str, name: str, indexes) -> list[str]:
    """The summaries of the drain reports the supervisor left for workers not in ``indexes`` (the
    runtime's worker set now), removing every report file (those of workers back in the set are
    stale)."""
    rdir = runtime_dir(home, namespace, name)
    lines = []
    for entry in sorted(os.listdir(rdir)) if os.path.isdir(rdir) else []:
        if not (entry.startswith("drain-worker-") and entry.endswith(".json")):
            continue
        path = os.path.join(rdir, entry)
        worker = entry[len("drain-"):-len(".json")]
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, ValueError):
            continue
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        if workerset.index_of(worker) not in indexes:
            lines.append(drain_summary(worker, report))
    return lines


def _disk_levels(home: str, runtime):
    """``(level, in-process cache directory)`` of each disk level of ``runtime`` (the layout of
    ``datacache.stack.layout``: ``<level path>/<ns>/<name>``, workers' directories below it)."""
    for level in runtime.spec.tieredstore.ordered_levels:
        if level.mediumtype != "MEM":
            yield level, layout.level_dir(home, runtime, level)


def _disk_bases(home: str, runtime):
    """The in-process cache directory of each disk level of ``runtime``."""
    return (base for _, base in _disk_levels(home, runtime))


def merge_caches(home: str, runtime) -> list[str]:
    """After :func:`return_cache` (workers stopped): copy every other worker's blocks of the
    dataset's current files into the in-process cache, per disk level, within the high watermark
    of the level's quota (:func:`datacache.cluster.merge.merge_into`). Returns one summary line per
    worker directory that held blocks of the dataset. Raises ``OSError`` if a directory cannot be
    opened."""
    from datacache.cache.disk import DiskTier
    from datacache.stack.workerproc import current_files

    ns, name = runtime.metadata.namespace, runtime.metadata.name
    levels = [(level, base, merge.worker_dirs(base)) for level, base in _disk_levels(home, runtime)]
    if not any(workers for _, _, workers in levels):
        return []  # nothing to copy: do not load the manifest's file ids (a million files: ~80 MB)
    current = current_files(home, ns, name, runtime.spec.block_size_bytes)
    lines = []
    for level, base, workers in levels:
        if not workers:
            continue
        target = DiskTier(base, level.quota_bytes, level.high, level.low, level.mediumtype,
                          runtime.spec.block_size_bytes, level.free_space_ratio)
        try:
            for worker in workers:
                report = merge.merge_into(target, int(level.quota_bytes * level.high), os.path.join(base, worker),
                                          name, current)
                if report["blocks"] or report["stale"]:
                    lines.append(merge.summary(worker, report))
                    log.info("%s", lines[-1])
        finally:
            target.close()
    return lines


def _move_cache(source: str, target: str) -> None:
    """Rename every entry of the cache in ``source`` (not the workers' directories) into ``target``."""
    private.makedirs(target)
    for entry in os.listdir(source):
        if not entry.startswith("worker-"):
            os.replace(os.path.join(source, entry), os.path.join(target, entry))


def adopt_in_process_cache(home: str, runtime) -> list[str]:
    """Make the in-process cache of CacheRuntime ``runtime`` (a model) the first worker's of its
    worker set that has no cache yet, per disk level (see the module docstring); returns the
    directories adopted. Raises ``OSError`` if a rename fails."""
    ns, name = runtime.metadata.namespace, runtime.metadata.name
    indexes = workerset.desired(home, ns, name, runtime.spec.replicas)
    adopted = []
    for base in _disk_bases(home, runtime):
        free = [os.path.join(base, f"worker-{i}") for i in indexes
                if not holds_cache(os.path.join(base, f"worker-{i}"))]
        if holds_cache(base) and free:
            _move_cache(base, free[0])
            adopted.append(base)
    return adopted


def return_cache(home: str, runtime, index: int) -> list[str]:
    """Make worker ``index``'s cache the in-process cache of ``runtime`` again, per disk level where
    the in-process directory has no cache of its own (renames, no byte copied; the workers must be
    stopped). Returns the worker directories returned. Raises ``OSError`` if a rename fails."""
    returned = []
    for base in _disk_bases(home, runtime):
        worker = os.path.join(base, f"worker-{index}")
        if holds_cache(worker) and not holds_cache(base):
            _move_cache(worker, base)
            returned.append(worker)
    return returned


def stop(home: str, namespace: str, name: str, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop the runtime's supervisor and every worker it started (SIGTERM, then SIGKILL after
    ``timeout`` s), and forget their registrations."""
    rdir, _ = _paths(home, namespace, name)
    if not os.path.isdir(rdir):
        return
    pid = read_pid(os.path.join(rdir, "supervisor.pid"))
    if pid is not None:
        _kill(pid, timeout)
    for entry in sorted(os.listdir(rdir)):
        if entry.startswith("worker-") and entry.endswith(".pid"):
            wpid = read_pid(os.path.join(rdir, entry))
            if wpid is not None:
                _kill(wpid, timeout)
            os.unlink(os.path.join(rdir, entry))
    members = Membership(home)
    for m in members.members(namespace, name):
        if _start_time(m.pid) is None:
            members.remove(namespace, name, m.worker_id, m.pid)
    members.close()


# -- the daemon ----------------------------------------------------------------------------------------
@dataclass
class _Child:
    proc: subprocess.Popen | None = None
    spec: str = ""
    started: float = 0.0
    backoff: float = 0.5
    next_start: float = 0.0


class Supervisor:
    """The daemon loop for runtime ``namespace``/``name`` (see the module docstring)."""

    def __init__(self, home: str, namespace: str, name: str, poll_s: float = 0.25):
        self.home, self.namespace, self.name, self.poll_s = home, namespace, name, poll_s
        self.dir, self.logs = _paths(home, namespace, name)
        self._children: dict[int, _Child] = {}
        self._stopping = threading.Event()
        self._drain_s = drain_timeout()

    def run(self) -> int:
        """Supervise until the runtime goes away or SIGTERM; returns the exit status (0)."""
        from datacache.state import StateStore

        private.makedirs(self.dir)
        lock = os.open(private.touch(os.path.join(self.dir, "supervisor.lock")), os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0  # another supervisor owns this runtime
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stopping.set())
        write_pid(os.path.join(self.dir, "supervisor.pid"), os.getpid())
        state, self._members = StateStore(self.home), Membership(self.home)
        self._state = state
        try:
            self._adopt(state)
            while not self._stopping.is_set():
                desired, spec, port = self._desired(state)
                if desired < 2:
                    break
                self._converge(desired, spec, port)
                self._stopping.wait(self.poll_s)
        finally:
            self._stop_children(list(self._children))
            os.unlink(os.path.join(self.dir, "supervisor.pid"))
            state.close()
            self._members.close()
        return 0

    def _adopt(self, state) -> None:
        from datacache.api.loader import load_resource_dict

        doc = state.get("CacheRuntime", self.name, self.namespace)
        if doc is not None and int(doc["spec"].get("replicas", 1)) >= 2:
            for path in adopt_in_process_cache(self.home, load_resource_dict(doc, "state")):
                log.info("the in-process cache %s is worker-0's now", path)

    def _desired(self, state) -> tuple[int, str, int]:
        """``(replicas, digest of everything else a worker depends on, base port or 0)``."""
        runtime = state.get("CacheRuntime", self.name, self.namespace)
        dataset = state.get("Dataset", self.name, self.namespace)
        if runtime is None or dataset is None:
            return 0, "", 0
        # Neither the worker count nor the autoscale policy changes what a worker does: no restart.
        spec = {k: v for k, v in runtime["spec"].items() if k not in ("replicas", "autoscale")}
        digest = hashlib.sha256(json.dumps([spec, dataset["spec"]], sort_keys=True).encode()).hexdigest()
        port = (spec.get("worker") or {}).get("port") or 0
        return int(runtime["spec"].get("replicas", 1)), digest, port

    def _converge(self, desired: int, spec: str, port: int) -> None:
        now = time.monotonic()
        indexes = workerset.desired(self.home, self.namespace, self.name, desired)
        for i in indexes:
            child = self._children.setdefault(i, _Child())
            if child.proc is not None and child.proc.poll() is None:
                if child.spec != spec:
                    log.info("worker-%d: spec changed, restarting", i)
                    self._stop_children([i])
                continue
            if child.proc is not None:  # exited: back off if it did not last
                lasted = now - child.started
                child.backoff = 0.5 if lasted > 10 else min(child.backoff * 2, _BACKOFF_MAX_S)
                child.next_start = now + child.backoff
                log.warning("worker-%d exited with %s after %.1fs; restart in %.1fs", i, child.proc.returncode,
                            lasted, child.backoff)
                child.proc = None
            if now >= child.next_start:
                self._start(i, child, spec, port + i if port else 0)
        extra = [i for i in self._children if i not in indexes]
        if extra:
            self._drain(extra)
            self._stop_children(extra)

    def _drain(self, indexes: list[int]) -> None:
        """Drain the running workers among ``indexes`` before they are stopped (see the module
        docstring): out of placement, then all hand their blocks off at once, for at most
        :func:`drain_timeout` seconds. Each report is logged and written to ``drain-worker-<i>.json``."""
        from datacache.api.loader import load_resource_dict

        running = {f"worker-{i}" for i in indexes
                   if self._children[i].proc is not None and self._children[i].proc.poll() is None}
        live = self._members.live(self.namespace, self.name)
        leaving = [m for m in live if m.worker_id in running]
        doc = self._state.get("CacheRuntime", self.name, self.namespace)
        if not leaving or doc is None:
            return
        if len(leaving) == len(live):
            reports: list = [{"error": "no other live worker to hand its blocks to"}] * len(leaving)
        else:
            for m in leaving:
                self._members.drain(self.namespace, self.name, m.worker_id, m.pid)
            block_size = load_resource_dict(doc, "state").spec.block_size_bytes
            from datacache.cluster.worker_client import LoopThread, WorkerClient  # aiohttp: only when draining

            client = WorkerClient(load_token(self.home, self.namespace, self.name), self.name, block_size)
            io = LoopThread("datacache-drain")
            bound = self._drain_s + 2 * STOP_TIMEOUT_S  # the workers' own bound, plus a pass in flight
            try:
                reports = io.gather([client.drain(m.url, m.worker_id, self._drain_s) for m in leaving], bound)
            except TimeoutError:
                reports = [TimeoutError(f"no answer within {bound}s")] * len(leaving)
            finally:
                io.run(client.close())
                io.close()
        for m, report in zip(leaving, reports):
            if isinstance(report, BaseException):
                report = {"error": f"{type(report).__name__}: {report}"}
            log.info("%s", drain_summary(m.worker_id, report))
            path = private.touch(os.path.join(self.dir, f"drain-{m.worker_id}.json"))
            with open(path, "w") as f:
                json.dump(report, f)

    def _start(self, index: int, child: _Child, spec: str, port: int) -> None:
        argv = _cli("worker", "serve", self.name, "-n", self.namespace, "--home", self.home, "--index", str(index),
                    "--port", str(port), "--exit-with-parent")
        child.proc = _spawn(argv, f"{self.logs}.worker-{index}.log")
        child.spec, child.started = spec, time.monotonic()
        write_pid(os.path.join(self.dir, f"worker-{index}.pid"), child.proc.pid)

    def _stop_children(self, indexes: list[int]) -> None:
        procs = [(i, self._children.pop(i).proc) for i in indexes]
        for _, proc in procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        for i, proc in procs:
            if proc is not None:
                try:
                    proc.wait(STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                self._members.remove(self.namespace, self.name, f"worker-{i}", proc.pid)
            pid_file = os.path.join(self.dir, f"worker-{i}.pid")
            if os.path.exists(pid_file):
                os.unlink(pid_file)
