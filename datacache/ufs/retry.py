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
