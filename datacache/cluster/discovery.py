"""DNS membership: the live workers of a runtime on Kubernetes, from its headless Service.

The operator runs a runtime's workers behind the headless Service ``<runtime>-worker``
(:func:`service_name`) whose port is named ``http`` (:data:`PORT_NAME`). Kubernetes DNS then
serves one SRV record per *ready* worker pod (``publishNotReadyAddresses`` is off)::

    _http._tcp.<runtime>-worker.<namespace>.svc.<cluster domain>  SRV  0 100 <port> <target>

so readiness plays the role the heartbeat plays in embedded mode (:mod:`.membership`). A worker's
placement identity ``worker-<i>`` comes from the SRV target:

- StatefulSet workers: the target is the pod's stable name ``<runtime>-worker-<i>.<service>...``
  and ``<i>`` is the pod's ordinal, the ``--index`` the pod was started with (as Alluxio, JuiceFS
  and Fluid workers are named by their StatefulSet ordinal).
- DaemonSet workers have no ordinal (their index is the CRC-32 of the node's name, see
  ``datacache_operator.manifests``) and Kubernetes names their targets after their addresses.
  Such a target is identified once by asking the worker's ``GET /healthz``, which answers the
  ``worker-<i>`` it was started with; the answer is kept per address (a restarted pod keeps its
  node, so its index).

Each answer is kept ``ttl_s`` seconds (2 s), so reads do not cost a lookup each. When a lookup
fails (timeout, SERVFAIL, no server), the last good answer is used while it is younger than
``stale_s`` seconds (30 s), and a failed lookup is retried only after ``ttl_s``, so a read pays at
most one lookup timeout (1 s) per TTL; after that :class:`MembershipUnavailableError` is raised. NXDOMAIN or an
empty answer is a good answer: no worker is ready. Names are queried fully qualified, so the
pod's ``ndots:5`` search list costs no extra queries. Members found by DNS carry no pid and no
disk level (``pid=0``, ``disk={}``): clients read them over HTTP, never short-circuited.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import re
import threading
import time
import urllib.request

import dns.exception
import dns.rdatatype
import dns.resolver

from datacache.cluster.member import Member

log = logging.getLogger(__name__)

PORT_NAME = "http"
"""Name of the workers' port in the headless Service: the SRV service label ``_http._tcp``."""
TTL_S = 2.0
STALE_S = 30.0
LOOKUP_S = 1.0  # seconds one lookup (all retries) may take; cluster DNS answers in milliseconds
HEALTHZ_S = 2.0  # seconds to wait for a DaemonSet worker's /healthz


def service_name(runtime: str) -> str:
    """The headless Service of CacheRuntime ``runtime``'s workers (``<runtime>-worker``)."""
    return f"{runtime}-worker"


def srv_name(namespace: str, runtime: str, domain: str = "cluster.local") -> str:
    """The fully qualified SRV name listing the ready workers of ``namespace/runtime``."""
    return f"_{PORT_NAME}._tcp.{service_name(runtime)}.{namespace}.svc.{domain}."


class MembershipUnavailableError(OSError):
    """The workers' DNS records could not be read for longer than the stale bound (errno EIO)."""

    def __init__(self, qname: str, age: float | None, cause: BaseException):
        held = "no earlier answer" if age is None else f"the last answer is {age:.1f} s old"
        super().__init__(errno.EIO, f"worker membership unavailable: DNS lookup of {qname} failed "
                                    f"({type(cause).__name__}: {cause}) and {held}; check the cluster "
                                    f"DNS and the workers' headless Service")


class DnsMembership:
    """Live workers from Kubernetes DNS; same ``live``/``close`` interface as ``Membership``.

    ``nameserver``: ``"host:port"`` of the DNS server to ask (None: ``/etc/resolv.conf``);
    ``domain``: the cluster domain; ``ttl_s``/``stale_s``: seconds an answer is reused / kept
    through failed lookups.
    """

    def __init__(self, nameserver: str | None = None, domain: str = "cluster.local", ttl_s: float = TTL_S,
                 stale_s: float = STALE_S):
        self._resolver = dns.resolver.Resolver(configure=nameserver is None)
        if nameserver is not None:
            host, _, port = nameserver.rpartition(":")
            self._resolver.nameservers = [host.strip("[]")]
            self._resolver.port = int(port)
        self._resolver.lifetime = LOOKUP_S
        self.domain, self.ttl_s, self.stale_s = domain, ttl_s, stale_s
        # (namespace, runtime) -> (monotonic time of the last good answer, of the last lookup, members)
        self._answers: dict[tuple[str, str], tuple[float | None, float | None, list[Member]]] = {}
        self._ids: dict[str, str] = {}  # worker URL -> worker id said by its /healthz
        self._lock = threading.Lock()

    def live(self, namespace: str, runtime: str) -> list[Member]:
        """Ready workers of ``namespace/runtime`` by worker index. Raises
        :class:`MembershipUnavailableError` when DNS failed and the last answer is older than
        ``stale_s`` seconds (or there is none)."""
        with self._lock:
            fetched, tried, members = self._answers.get((namespace, runtime), (None, None, []))
            if tried is not None and time.monotonic() - tried < self.ttl_s:
                return members
            qname = srv_name(namespace, runtime, self.domain)
            try:
                found = self._lookup(qname, runtime)
            except dns.exception.DNSException as err:
                now = time.monotonic()
                age = None if fetched is None else now - fetched
                if age is None or age >= self.stale_s:
                    raise MembershipUnavailableError(qname, age, err) from None
                log.warning("DNS lookup of %s failed (%s): using the answer of %.1f s ago", qname, err, age)
                # A failed lookup is not retried for ttl_s either: reads pay at most one timeout per TTL.
                self._answers[(namespace, runtime)] = (fetched, now, members)
                return members
            now = time.monotonic()
            self._answers[(namespace, runtime)] = (now, now, found)
            return found

    def draining(self, namespace: str, runtime: str) -> list[Member]:
        """Workers being drained: none (a terminating pod leaves the Service at once; a preStop
        drain is not built), for the same interface as ``Membership``."""
        return []

    def _lookup(self, qname: str, runtime: str) -> list[Member]:
        try:
            answer = self._resolver.resolve(qname, "SRV")
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        # Kubernetes DNS puts the targets' addresses in the additional section; ask for the rest.
        addresses: dict[str, str] = {}
        for rrset in answer.response.additional:
            if rrset.rdtype in (dns.rdatatype.A, dns.rdatatype.AAAA):
                addresses.setdefault(rrset.name.to_text(), rrset[0].address)
        found: dict[str, Member] = {}
        for srv in answer:
            target = srv.target.to_text()
            address = addresses.get(target) or self._address(target)
            if address is None:  # the pod went away between the two answers
                continue
            host = f"[{address}]" if ipaddress.ip_address(address).version == 6 else address
            url, pod = f"http://{host}:{srv.port}", target.split(".", 1)[0]
            worker_id = ordinal_worker_id(pod, runtime) or self._healthz_id(url)
            if worker_id is not None:
                found[worker_id] = Member(worker_id, url, pod, 0)
        return sorted(found.values(), key=lambda m: m.index)

    def _address(self, target: str) -> str | None:
        """``target``'s IPv4 address, else its IPv6 one; None when it has neither."""
        for rdtype in ("A", "AAAA"):
            try:
                return self._resolver.resolve(target, rdtype)[0].address
            except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
                continue
        return None

    def _healthz_id(self, url: str) -> str | None:
        """The worker id ``url``'s ``/healthz`` answers (kept per URL); None when it does not answer."""
        if url not in self._ids:
            try:
                with urllib.request.urlopen(url + "/healthz", timeout=HEALTHZ_S) as resp:
                    worker_id = json.load(resp)["worker"]
            except (OSError, ValueError, KeyError) as err:
                log.warning("worker at %s did not say its id (%s): left out until it does", url, err)
                return None
            if not _WORKER_ID.fullmatch(worker_id):
                return None
            self._ids[url] = worker_id
        return self._ids[url]

    def close(self) -> None:
        """Nothing to release (kept for the ``Membership`` interface)."""


_WORKER_ID = re.compile(r"worker-\d+")


def ordinal_worker_id(pod: str, runtime: str) -> str | None:
    """``worker-<i>`` for StatefulSet pod ``<runtime>-worker-<i>``, else None."""
    prefix = f"{service_name(runtime)}-"
    ordinal = pod[len(prefix):] if pod.startswith(prefix) else ""
    return f"worker-{int(ordinal)}" if ordinal.isdigit() else None
