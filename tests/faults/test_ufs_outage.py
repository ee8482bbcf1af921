"""UFS outage behind a FaultProxy: cached data keeps reading, uncached reads fail in bounded time
with UFSUnavailableError (EIO) after capped-backoff retries, and recover by themselves."""

from __future__ import annotations

import errno

import pytest

from datacache.errors import ResourceError, UFSUnavailableError
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


def test_a_timeout_that_is_not_a_number_is_a_clear_error(datacache_home, moto_secrets, fault_moto, proxy):
    mount = s3_mount(fault_moto, "any-bucket")
    mount["options"] = {"endpoint_url": proxy.endpoint_url, "read_timeout": "ten"}
    with pytest.raises(ResourceError, match=r"spec.mounts\[0\]: cannot open mountPoint .*'ten'"):
        apply_dataset(datacache_home, "badtimeout", [mount]).open_dataset("badtimeout")
