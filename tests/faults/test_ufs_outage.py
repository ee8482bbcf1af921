"""UFS outage behind a FaultProxy: cached data keeps reading, uncached reads fail in bounded time
with UFSUnavailableError (EIO) after capped-backoff retries, and recover by themselves."""

from __future__ import annotations

import errno

import pytest

from datacache.errors import ConfigError, UFSUnavailableError
from datacache.ufs.retry import DEFAULT_POLICY
from fault_support import apply_dataset, apply_proxied, read_all, s3_mount, sha, timed

FAULTS = ("refuse", "stall", "reset", "500", "503", "slowdown")
# Per try at most connect 1 s + read 2 s (FAST_FAIL), plus the capped waits between tries.
BOUND_S = DEFAULT_POLICY.attempts * 3 + (DEFAULT_POLICY.attempts - 1) * DEFAULT_POLICY.max_wait + 2


@pytest.fixture
def client(datacache_home, moto_secrets, fault_moto, proxy, bucket_of, objects):
    plane = apply_proxied(datacache_home, "outage", fault_moto, proxy, bucket_of(objects))
    c = plane.open_dataset("outage")
    yield c
    c.close()
    plane.close()


@pytest.mark.parametrize("fault", FAULTS)
def test_outage_cached_reads_uncached_fails_then_recovers(client, proxy, objects, fault):
    want_cached = sha(objects["cached.bin"])
    assert sha(read_all(client, "cached.bin")) == want_cached  # now cached
    cold = f"cold-{FAULTS.index(fault)}.bin"

    proxy.set_mode(fault)
    gets_before = proxy.object_gets(cold)
    assert sha(read_all(client, "cached.bin")) == want_cached
    err, took = timed(lambda: read_all(client, cold))
    assert isinstance(err, UFSUnavailableError), repr(err)
    assert err.errno == errno.EIO and "UFS read failed and the block is not cached" in str(err)
    assert took < BOUND_S, f"{fault}: failed after {took:.1f} s, bound {BOUND_S} s"
    if fault != "refuse":  # refused connections never reach the proxy's counter
        assert proxy.object_gets(cold) - gets_before == DEFAULT_POLICY.attempts
    # The waits between tries are at least first_wait * (1 + 2 + ...): backoff, not a busy loop.
    assert took >= DEFAULT_POLICY.first_wait * (2 ** (DEFAULT_POLICY.attempts - 1) - 1)

    proxy.set_mode("pass")
    assert sha(read_all(client, cold)) == sha(objects[cold])  # recovered, nothing to reset
    assert sha(read_all(client, "cached.bin")) == want_cached


@pytest.mark.parametrize("options, problem", [
    ({"read_timeout": "ten"}, r"options\.read_timeout: expected a number of seconds above 0 to 3600, got 'ten'"),
    ({"retries": -1}, r"options\.retries: expected an integer from 0 to 20, got -1"),
    ({"retries": 2.5}, r"options\.retries: expected an integer from 0 to 20, got 2\.5"),
    ({"retry_max_backoff": "0"}, r"options\.retry_max_backoff: expected a number of seconds above 0 to 300, got 0"),
])
def test_bad_timeout_or_retry_option_is_a_located_error(datacache_home, fault_moto, proxy, options, problem):
    mount = s3_mount(fault_moto, "any-bucket")
    mount["options"] = {"endpoint_url": proxy.endpoint_url, **options}
    with pytest.raises(ConfigError, match=r"spec\.mounts\[0\]\." + problem) as info:
        apply_dataset(datacache_home, "badoption", [mount])
    assert "\n" not in str(info.value)  # one line: one problem


def test_retries_and_backoff_cap_are_mount_options(datacache_home, moto_secrets, fault_moto, proxy, bucket_of,
                                                   objects):
    """``retries: 4`` makes 5 tries, ``retry_max_backoff: 0.1`` caps each wait at 0.1 s (+ jitter)."""
    mount = s3_mount(fault_moto, bucket_of(objects))
    mount["options"] = {"endpoint_url": proxy.endpoint_url, "retries": 4, "retry_max_backoff": 0.1,
                        "connect_timeout": 1, "read_timeout": 2}
    plane = apply_dataset(datacache_home, "retryopts", [mount])
    client = plane.open_dataset("retryopts")
    try:
        proxy.set_mode("503")
        before = proxy.object_gets("cold-0.bin")
        err, took = timed(lambda: read_all(client, "cold-0.bin"))
        assert isinstance(err, UFSUnavailableError), repr(err)
        assert proxy.object_gets("cold-0.bin") - before == 5
        assert 4 * 0.1 <= took < 4 * 0.2 + 2, f"{took:.2f} s for 4 capped waits"
        proxy.set_mode("pass")
        assert sha(read_all(client, "cold-0.bin")) == sha(objects["cold-0.bin"])
    finally:
        client.close()
        plane.close()
