"""Fixtures of the cluster tests: every process a test starts is stopped in ``finally``."""

from __future__ import annotations

import pytest

from cluster_support import reap


@pytest.fixture
def cluster_home(datacache_home):
    """``$DATACACHE_HOME`` for a test that starts workers; afterwards every runtime is stopped and
    the test fails if any process it started was still running."""
    try:
        yield datacache_home
    finally:
        leftovers = reap(datacache_home)
    assert not leftovers, f"processes left running: {leftovers}"


@pytest.fixture(scope="module")
def module_home(tmp_path_factory):
    """A ``$DATACACHE_HOME`` shared by one test module's cluster (cleaned up the same way)."""
    home = tmp_path_factory.mktemp("cluster") / "home"
    home.mkdir()
    try:
        yield home
    finally:
        leftovers = reap(home)
    assert not leftovers, f"processes left running: {leftovers}"
