"""Retry of UFS reads: a failed read of an uncached block is tried again with capped backoff.

One policy for every UFS (S3, GCS, HTTP, local), applied around a whole exact-version read (the
request *and* its body, so a connection reset mid-body is retried too, which s3fs's own retry
does not cover). Only :class:`~datacache.errors.UFSUnavailableError` (outage, timeout, 5xx,
SlowDown) is retried; a missing file or a changed version is an answer, not a fault.

Bound: ``attempts`` tries, waiting ``first_wait * 2**n`` seconds (n = 0, 1, ...) between them,
capped at ``max_wait``, plus a random jitter of up to ``first_wait`` (AWS's "exponential backoff
with jitter"). Each try is itself bounded by the UFS client's timeouts (for S3 the mount options
``connect_timeout``/``read_timeout``), so a read fails after at most ``attempts * per-try timeout
+ (attempts - 1) * (max_wait + first_wait)`` seconds — never a hang — and succeeds again by
itself once the UFS answers.

User settings (a mount's ``options``, next to ``connect_timeout``/``read_timeout``; JuiceFS calls the
first ``--io-retries``): ``retries`` — tries after the first failed one (0..20, default 2, so 3
tries) — and ``retry_max_backoff`` — the cap of the wait between tries in seconds (0 < x <= 300,
default 2). :func:`option_problems` checks them (and the two timeouts) when a Dataset is loaded;
:func:`policy_from_options` builds the policy of a mount.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

import tenacity

from datacache.errors import UFSUnavailableError

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all (>= 1); waits in seconds start at ``first_wait``, double, capped at
    ``max_wait``."""

    attempts: int = 3
    first_wait: float = 0.2
    max_wait: float = 2.0

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried on UFSUnavailableError; the last such error is raised unchanged."""
        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(UFSUnavailableError),
            stop=tenacity.stop_after_attempt(self.attempts),
            wait=(tenacity.wait_exponential(multiplier=self.first_wait, max=self.max_wait)
                  + tenacity.wait_random(0, self.first_wait)),
            reraise=True,
        )
        return retrying(fn)


DEFAULT_POLICY = RetryPolicy()

RETRY_OPTIONS = ("retries", "retry_max_backoff")
"""Mount options that set a mount's :class:`RetryPolicy` (datacache's own, never given to fsspec)."""

# option -> (kind, low, high, low inclusive): the accepted values of the bound options
_BOUNDS = {
    "retries": (int, 0, 20, True),
    "retry_max_backoff": (float, 0.0, 300.0, False),
    "connect_timeout": (float, 0.0, 3600.0, False),
    "read_timeout": (float, 0.0, 3600.0, False),
}


def _parse(name: str, value) -> int | float:
    """``value`` of option ``name`` as its kind; raises ValueError with the accepted range."""
    kind, low, high, low_in = _BOUNDS[name]
    unit = "" if kind is int else " seconds"
    rng = f"{'an integer' if kind is int else 'a number of seconds'} {'from' if low_in else 'above'} {low:g} to {high:g}"
    try:
        if isinstance(value, bool) or (kind is int and isinstance(value, float) and not value.is_integer()):
            raise ValueError
        number = kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"expected {rng}, got {value!r}") from None
    if not ((low <= number) if low_in else (low < number)) or number > high:
        raise ValueError(f"expected {rng}, got {number:g}{unit}")
    return number


def option_problems(options: dict) -> list[tuple[str, str]]:
    """``[(option name, problem)]`` for bad ``retries``, ``retry_max_backoff``, ``connect_timeout``
    or ``read_timeout`` values in a mount's ``options``; [] when all are right or absent."""
    problems = []
    for name in _BOUNDS:
        if name in options:
            try:
                _parse(name, options[name])
            except ValueError as err:
                problems.append((name, str(err)))
    return problems


def policy_from_options(options: dict) -> RetryPolicy:
    """The policy a mount's ``options`` ask for (defaults for absent ones). Raises ValueError for a
    bad value (already refused by :func:`option_problems` when the Dataset was loaded)."""
    attempts = _parse("retries", options["retries"]) + 1 if "retries" in options else DEFAULT_POLICY.attempts
    cap = _parse("retry_max_backoff", options.get("retry_max_backoff", DEFAULT_POLICY.max_wait))
    return RetryPolicy(attempts=attempts, first_wait=min(DEFAULT_POLICY.first_wait, cap), max_wait=cap)
