"""Fixtures of the control-plane tests; the cluster helpers (workers, what they store) are shared
with tests/cluster."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "cluster"))

from cluster_support import reap  # noqa: E402


@pytest.fixture
def workers_home(datacache_home):
    """``$DATACACHE_HOME`` for a test that starts cache workers; all of them are stopped afterwards
    and the test fails if one was still running."""
    try:
        yield datacache_home
    finally:
        leftovers = reap(datacache_home)
    assert not leftovers, f"processes left running: {leftovers}"
