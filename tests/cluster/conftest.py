"""Fixtures of the cluster tests: every process a test starts is stopped in ``finally``."""

from __future__ import annotations

import glob
import os

import pytest

from cluster_support import reap

LOG_TAIL = 4000  # characters of each worker or supervisor log shown when a test fails


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the test item (the fixture below reads ``rep_call``)."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


def _print_logs(home) -> None:
    """The tail of every log under ``home/logs``: a failure in CI is then explained by what the
    workers and the supervisor said (shown with the test's captured output)."""
    for path in sorted(glob.glob(os.path.join(str(home), "logs", "*.log"))):
        with open(path, errors="replace") as f:
            text = f.read()
        print(f"----- {os.path.basename(path)} (last {LOG_TAIL} characters) -----\n{text[-LOG_TAIL:]}")


@pytest.fixture
def cluster_home(datacache_home, request):
    """``$DATACACHE_HOME`` for a test that starts workers; afterwards every runtime is stopped and
    the test fails if any process it started was still running. A failed test prints the tails of
    the workers' and supervisor's logs."""
    try:
        yield datacache_home
    finally:
        report = getattr(request.node, "rep_call", None)
        if report is not None and report.failed:
            _print_logs(datacache_home)
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
