"""Three cache workers on loopback serving one dataset (local + S3 mounts): every byte correct
across workers, C13/C14 status against what the workers store, token auth, request validation,
corrupt blocks, a slow owner, a worker killed mid-read and a worker restarted with its cache."""

from __future__ import annotations

import http.client
import json
import os
import random
import signal
import socket
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from cluster_support import (MiB, apply_cluster, block_bytes, corrupt_block_files, disrupt_mid_read, kill_worker, live,
                             open_client, stored_keys, wait_restarted, worker_dirs, worker_metrics)
from datacache.api.quantity import format_bytes
from datacache.cache.blocks import checksum
from datacache.cache.disk import DiskTier
from datacache.cluster import auth, transport, wire
from datacache.cluster.placement import owners
from datacache.warmup import warmup

NAME = "rd"
BLOCK = 256 << 10
LOCAL = {"empty.bin": 0, "one.bin": 1, "block.bin": BLOCK, "block-minus.bin": BLOCK - 1,
         "block-plus.bin": BLOCK + 1, "multi.bin": 5 * BLOCK + 12345, "big/large.bin": 16 * MiB + 7}
S3 = {"a space.bin": 3 * BLOCK + 5, "q?mark%.bin": 777, "中文/x.bin": 2 * BLOCK}


@pytest.fixture(scope="module")
def cluster(module_home, moto_server, tmp_path_factory):
    """``(plane, {dataset path: bytes})`` for a 3-worker runtime over a local dir and an S3 bucket."""
    src = tmp_path_factory.mktemp("src")
    contents = {}
    for name, size in LOCAL.items():
        os.makedirs(os.path.dirname(src / name), exist_ok=True)
        contents[f"local/{name}"] = data = os.urandom(size)
        (src / name).write_bytes(data)
    fs = moto_server.s3fs()
    bucket = f"cluster-{os.getpid()}-{random.randrange(1 << 30)}"
    fs.mkdir(bucket)
    for name, size in S3.items():
        contents[f"s3/{name}"] = data = os.urandom(size)
        fs.pipe(f"{bucket}/{name}", data)
    for key in ("key", "secret"):  # daemons read secrets from files, not from this test's env
        os.makedirs(module_home / "secrets" / "moto", exist_ok=True)
        (module_home / "secrets" / "moto" / key).write_text("testing")
    mounts = [{"name": "local", "mountPoint": str(src), "path": "/local"},
              {"name": "s3", "mountPoint": f"s3://{bucket}", "path": "/s3",
               "options": {"endpoint_url": moto_server.endpoint_url},
               "encryptOptions": [{"name": k, "valueFrom": {"secretKeyRef": {"name": "moto", "key": k}}}
                                  for k in ("key", "secret")]}]
    plane = apply_cluster(module_home, NAME, mounts)
    yield plane, contents
    plane.close()


def _metrics(home) -> dict[str, dict[str, float]]:
    return worker_metrics(home, NAME)


def _total(metrics, name):
    return sum(m.get(name, 0) for m in metrics.values())


def _read_all(client, contents):
    for path, data in contents.items():
        with client.open(path) as f:
            assert f.read() == data, path


def test_every_byte_correct_across_workers(cluster, module_home):
    plane, contents = cluster
    n_blocks = sum(-(-len(d) // BLOCK) for d in contents.values())
    before = _metrics(module_home)
    http = open_client(plane, NAME, short_circuit=False)
    _read_all(http, contents)  # cold: every block is filled once, by its owner
    rng = random.Random(7)
    for path, data in contents.items():
        with http.open(path) as f:
            for _ in range(5):
                off = rng.randrange(len(data) + 10)
                assert f.pread(off, 300_000) == data[off:off + 300_000]
    cold = _metrics(module_home)
    assert _total(cold, "datacache_worker_misses_total") - _total(before, "datacache_worker_misses_total") == n_blocks
    assert _total(cold, "datacache_worker_ufs_bytes_total") - _total(before, "datacache_worker_ufs_bytes_total") == \
        sum(len(d) for d in contents.values())

    local = open_client(plane, NAME)  # short-circuit: block files read directly, workers not asked
    _read_all(local, contents)
    assert _total(_metrics(module_home), "datacache_worker_hits_total") == _total(cold, "datacache_worker_hits_total")
    http.close()
    http = open_client(plane, NAME, short_circuit=False)
    _read_all(http, contents)  # warm over HTTP: sendfile hits, no UFS
    warm = _metrics(module_home)
    assert _total(warm, "datacache_worker_ufs_bytes_total") == _total(cold, "datacache_worker_ufs_bytes_total")
    assert _total(warm, "datacache_worker_hits_total") - _total(cold, "datacache_worker_hits_total") == n_blocks

    # Every block sits on exactly its HRW owner, and every worker got a share.
    expected = block_bytes(http.manifest, BLOCK, NAME)
    stored = stored_keys(module_home, NAME)
    workers = sorted(stored)
    assert len(workers) == 3 and all(stored[w] for w in workers)
    for key in expected:
        assert [w for w in workers if key in stored[w]] == owners(key, workers)
    http.close()
    local.close()


def test_c13_c14_status_after_warmup_equals_blocks_stored_on_workers(cluster, module_home):
    plane, contents = cluster
    client = plane.open_dataset(NAME)
    client.source.drop()
    assert not any(stored_keys(module_home, NAME).values())
    client.close()

    name, result = plane.warmup(NAME, ["/"])
    assert result.ok, result.targets
    dl = plane.state.get("DataLoad", name)["status"]
    assert dl["phase"] == "Complete"
    assert sorted(dl["workers"]) == ["worker-0", "worker-1", "worker-2"]
    assert sum(w["bytes"] for w in dl["workers"].values()) == sum(len(d) for d in contents.values())

    client = plane.open_dataset(NAME)
    expected = block_bytes(client.manifest, BLOCK, NAME)
    stored = stored_keys(module_home, NAME)
    held = set().union(*stored.values())
    assert set(expected) <= held  # C13: Complete means every block is on a worker's disk
    status = plane.refresh_status("Dataset", NAME)
    total = sum(len(d) for d in contents.values())
    assert status["cacheStates"]["cached"] == format_bytes(total) == status["ufsTotal"]
    assert status["cacheStates"]["cachedPercentage"] == "100.0%"

    # C14 with part of the cache gone: drop worker-1's blocks; status equals what remains on disk.
    member = live(module_home, NAME)["worker-1"]
    code, _ = _http("POST", member.url + "/v1/drop", _auth(module_home), body={"dataset": NAME})
    assert code == 200
    stored = stored_keys(module_home, NAME)
    remaining = sum(size for key, size in expected.items() if any(key in s for s in stored.values()))
    assert not stored["worker-1"] and 0 < remaining < total
    assert client.cached_bytes() == remaining
    status = plane.refresh_status("Dataset", NAME)
    assert status["cacheStates"]["cached"] == format_bytes(remaining)
    assert status["cacheStates"]["cachedPercentage"] == f"{1000 * remaining // total / 10:.1f}%"

    runtime = plane.refresh_status("CacheRuntime", NAME)
    assert (runtime["desiredWorkers"], runtime["readyWorkers"], runtime["phase"]) == (3, 3, "Ready")
    assert runtime["cacheCapacity"] == format_bytes(3 * 256 * MiB)
    for w in runtime["workers"]:
        wid = w["name"].removeprefix(f"{NAME}-")
        tier = DiskTier(worker_dirs(module_home, NAME)[wid], 256 * MiB)
        on_disk = tier.used()
        tier.close()
        assert w["capacity"] == 256 * MiB and abs(w["used"] - on_disk) <= 64 << 10
    client.close()


def _auth(home, token=None):
    return {"Authorization": f"Bearer {token or auth.load_token(str(home), 'default', NAME)}"}


def _http(method, url, headers=None, params=None, body=None):
    if params:
        url += "?" + urllib.parse.urlencode(params)
    data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _block_params(client, path, index=0):
    entry = client.stat(path)
    return {"dataset": NAME, "block_size": BLOCK, "index": index, "mount": entry.mount,
            "ufs_path": entry.ufs_path, "version": entry.version, "size": entry.size}


def test_token_auth_wrong_or_missing_token_gets_401_and_no_data(cluster, module_home):
    plane, contents = cluster
    client = plane.open_dataset(NAME)
    params = _block_params(client, "local/multi.bin")
    data = contents["local/multi.bin"][:BLOCK]
    token = auth.load_token(str(module_home), "default", NAME)
    url = next(iter(live(module_home, NAME).values())).url
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {token}x"},
                    {"Authorization": f"bearer {token}"}, {"Authorization": token}):
        code, body = _http("GET", url + "/v1/block", headers, params)
        assert code == 401 and data[:64] not in body and len(body) < 200
        for path, payload in (("/v1/exists", {"dataset": NAME, "keys": []}), ("/v1/drop", {"dataset": NAME}),
                              ("/v1/verify", {"dataset": NAME, "keys": []}),
                              ("/v1/fill", {"dataset": NAME, "block_size": BLOCK, "files": []})):
            assert _http("POST", url + path, headers, body=payload)[0] == 401
    code, body = _http("GET", url + "/v1/block", _auth(module_home), params)
    assert code == 200 and body == data
    assert _http("GET", url + "/healthz")[0] == 200
    code, body = _http("GET", url + "/metrics")
    assert code == 200 and b"datacache_worker_request_seconds_bucket" in body
    for name in ("cached_bytes", "capacity_bytes", "hits_total", "misses_total", "ufs_bytes_total",
                 "fills_in_flight", "evictions_total"):
        assert f"datacache_worker_{name}".encode() in body, name
    client.close()


def _local_http(url, headers, params):
    """GET /v1/block on the worker's abstract Unix socket (what same-node clients use)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(transport.local_address(url))
    conn = http.client.HTTPConnection("localhost", timeout=10)
    conn.sock = sock
    try:
        conn.request("GET", "/v1/block?" + urllib.parse.urlencode(params), headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.getheader("X-Block-Checksum"), resp.read()
    finally:
        conn.close()


def test_the_local_socket_serves_the_same_api_with_the_same_token(cluster, module_home):
    plane, contents = cluster
    client = plane.open_dataset(NAME)
    assert warmup(client, ["local/multi.bin"]).ok
    data = contents["local/multi.bin"][BLOCK:2 * BLOCK]
    for member in live(module_home, NAME).values():
        params = _block_params(client, "local/multi.bin", 1)
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            code, _, body = _local_http(member.url, headers, params)
            assert code == 401 and data[:64] not in body and len(body) < 200
        code, digest, body = _local_http(member.url, _auth(module_home), params)
        assert code == 200 and body == data and digest == checksum(data), member.worker_id
    client.close()


def test_every_request_field_is_validated(cluster, module_home):
    plane, _ = cluster
    client = plane.open_dataset(NAME)
    good = _block_params(client, "local/multi.bin")
    root = client.stat("local/multi.bin").ufs_path.rsplit("/", 1)[0]
    url, hdr = next(iter(live(module_home, NAME).values())).url, _auth(module_home)
    bad = [({"ufs_path": "/etc/passwd"}, 400), ({"ufs_path": root + "/../../../etc/passwd"}, 400),
           ({"ufs_path": root + "/./multi.bin"}, 400), ({"mount": "nope"}, 400), ({"index": 6}, 400),
           ({"index": -1}, 400), ({"size": "-5"}, 400), ({"size": "x"}, 400), ({"block_size": 4096}, 400),
           ({"dataset": "other"}, 409), ({"version": ""}, 400)]
    for change, status in bad:
        code, body = _http("GET", url + "/v1/block", hdr, {**good, **change})
        assert code == status, (change, code, body)
        assert b"root:" not in body
    for keys, status in ((["../../etc/passwd/0"], 400), ([f"other/{'0' * 32}/0"], 400), ("x", 400)):
        for path in ("/v1/exists", "/v1/verify"):
            assert _http("POST", url + path, hdr, body={"dataset": NAME, "keys": keys})[0] == status
    assert _http("POST", url + "/v1/verify", hdr, body={"dataset": "other", "keys": []})[0] == 409
    assert _http("POST", url + "/v1/exists", hdr, body=b"not json")[0] == 400
    files = [{"mount": "local", "ufs_path": "/etc/passwd", "version": "v", "size": 10, "blocks": [0]}]
    assert _http("POST", url + "/v1/fill", hdr, body={"dataset": NAME, "block_size": BLOCK, "files": files})[0] == 400
    files = [{**wire.entry_fields(client.stat("local/multi.bin")), "blocks": [0]}]
    for flag in ("check", "bulk"):
        code, body = _http("POST", url + "/v1/fill", hdr,
                           body={"dataset": NAME, "block_size": BLOCK, "files": files, flag: "yes"})
        assert code == 400 and f"{flag}: expected true or false".encode() in body, (flag, code, body)
    client.close()


def test_a_corrupt_block_on_a_worker_is_never_returned(cluster, module_home):
    plane, contents = cluster
    client = plane.open_dataset(NAME)
    warmup(client, ["local/multi.bin"])
    key = str(client.source.key(client.stat("local/multi.bin"), 2))
    assert corrupt_block_files(worker_dirs(module_home, NAME).values(), key) >= 1
    client.close()
    for short_circuit in (True, False):
        reader = open_client(plane, NAME, short_circuit=short_circuit)
        with reader.open("local/multi.bin") as f:
            assert f.read() == contents["local/multi.bin"]
        reader.close()


def test_a_slow_owner_times_out_to_the_next_worker(cluster, module_home):
    plane, contents = cluster
    slow = live(module_home, NAME)["worker-2"]
    client = open_client(plane, NAME, short_circuit=False, read_timeout=0.5, connect_timeout=0.5)
    os.kill(slow.pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        _read_all(client, contents)
        assert time.monotonic() - started < 15
    finally:
        os.kill(slow.pid, signal.SIGCONT)
        client.close()


def test_kill_9_a_worker_in_the_middle_of_a_read(cluster, module_home):
    plane, contents = cluster
    client = open_client(plane, NAME, short_circuit=False)
    client.source.drop()  # cold: the reads go to the workers, which fill from the UFS
    path, data = "local/big/large.bin", contents["local/big/large.bin"]

    def chunks():
        with client.open(path) as f:
            while chunk := f.read(BLOCK):
                yield chunk
                time.sleep(0.01)

    victims = []
    got = disrupt_mid_read(chunks(), 16, lambda: victims.append(kill_worker(module_home, NAME, "worker-1")))
    assert b"".join(got) == data
    (victim,) = victims
    wait_restarted(module_home, NAME, victim)
    _read_all(client, {path: data})
    client.close()


def test_a_restarted_worker_keeps_its_blocks(cluster, module_home):
    plane, contents = cluster
    client = plane.open_dataset(NAME)
    assert warmup(client).ok
    before = stored_keys(module_home, NAME)["worker-0"]
    assert before
    victim = kill_worker(module_home, NAME, "worker-0")
    restarted = wait_restarted(module_home, NAME, victim)
    assert stored_keys(module_home, NAME)["worker-0"] >= before
    client.close()

    client = open_client(plane, NAME, short_circuit=False)
    assert all(client.cached_fraction(e) == 1.0 for e in client.manifest)
    _read_all(client, contents)
    after = _metrics(module_home)["worker-0"]
    assert after["datacache_worker_ufs_bytes_total"] == 0 and after["datacache_worker_misses_total"] == 0
    assert after["datacache_worker_hits_total"] > 0
    assert live(module_home, NAME)["worker-0"].pid == restarted.pid
    client.close()


def _data_leaked(body: bytes, contents) -> bool:
    return any(len(d) >= 64 and d[:64] in body for d in contents.values())


def test_a_token_of_another_dataset_gets_401_and_no_data(cluster, module_home):
    plane, contents = cluster
    auth.ensure_token(str(module_home), "default", "other")  # a real token, of another runtime
    other = auth.load_token(str(module_home), "default", "other")
    assert other != auth.load_token(str(module_home), "default", NAME)
    client = plane.open_dataset(NAME)
    params = _block_params(client, "local/multi.bin")
    key = str(client.source.key(client.stat("local/multi.bin"), 0))
    client.close()
    hdr = _auth(module_home, other)
    for member in live(module_home, NAME).values():
        for method, path, kwargs in (("GET", "/v1/block", {"params": params}),
                                     ("GET", "/v1/block", {"params": {"dataset": NAME, "key": key}}),
                                     ("POST", "/v1/exists", {"body": {"dataset": NAME, "keys": [key]}}),
                                     ("POST", "/v1/pull", {"body": {"dataset": NAME, "from": "worker-0", "keys": [key]}}),
                                     ("POST", "/v1/drop", {"body": {"dataset": NAME}})):
            code, body = _http(method, member.url + path, hdr, **kwargs)
            assert code == 401 and not _data_leaked(body, contents), (path, code)
    assert all(stored_keys(module_home, NAME).values())  # the drop was refused


def test_oversized_and_malformed_requests_get_4xx_and_no_data(cluster, module_home):
    plane, contents = cluster
    client = plane.open_dataset(NAME)
    good = _block_params(client, "local/multi.bin")
    client.close()
    url, hdr = next(iter(live(module_home, NAME).values())).url, _auth(module_home)
    json_hdr = {**hdr, "Content-Type": "application/json"}
    cases = [  # (method, path, headers, params, body, expected status)
        ("POST", "/v1/exists", json_hdr, None, b"[" + b"1," * (9 << 20) + b"1]", 413),  # past 16 MiB
        ("POST", "/v1/exists", hdr, None, {"dataset": NAME, "keys": ["x"] * (wire.MAX_KEYS + 1)}, 400),
        ("POST", "/v1/pull", hdr, None, {"dataset": NAME, "from": "worker-0", "keys": ["x"] * 257}, 400),
        ("GET", "/v1/block", hdr, {**good, "ufs_path": "a" * 100_000}, None, 400),  # request line too long
        ("GET", "/v1/block", {**hdr, "X-Pad": "a" * 100_000}, good, None, 400),  # header too long
        ("GET", "/v1/block", hdr, {**good, "index": "1e3"}, None, 400),
        ("GET", "/v1/block", hdr, {**good, "size": "9" * 30}, None, 400),
        ("GET", "/v1/block", hdr, {**good, "ufs_path": good["ufs_path"] + "\0"}, None, 400),
        ("GET", "/v1/block", hdr, {"dataset": NAME, "key": "../../../etc/passwd"}, None, 400),
        ("GET", "/v1/block", hdr, {"dataset": NAME, "key": f"{NAME}/../../x/0"}, None, 400),
        ("GET", "/v1/block", hdr, {"dataset": NAME, "key": f"other/{'0' * 32}/0"}, None, 400),
        ("GET", "/v1/block", hdr, {"dataset": NAME, "key": f"{NAME}/{'0' * 32}/0"}, None, 404),  # not held
        ("GET", "/v1/block", hdr, {"dataset": "other", "key": f"other/{'0' * 32}/0"}, None, 409),
        ("POST", "/v1/exists", json_hdr, None, b"{not json", 400),
        ("POST", "/v1/exists", hdr, None, [NAME], 400),
        ("POST", "/v1/exists", hdr, None, {"dataset": NAME, "keys": [1, 2]}, 400),
        ("POST", "/v1/pull", hdr, None, {"dataset": NAME, "from": "../worker-0", "keys": []}, 400),
        ("POST", "/v1/fill", hdr, None, {"dataset": NAME, "block_size": BLOCK, "files": {"a": 1}}, 400),
        ("POST", "/v1/fill", hdr, None, {"dataset": NAME, "block_size": BLOCK,
                                         "files": [{**good, "blocks": list(range(10))}]}, 400),
        ("GET", "/v1/nothing", hdr, None, None, 404),
        ("DELETE", "/v1/block", hdr, good, None, 405),
    ]
    for method, path, headers, params, body, status in cases:
        code, answer = _http(method, url + path, headers, params, body)
        assert code == status, (path, params and list(params), code, answer[:200])
        assert not _data_leaked(answer, contents) and b"root:" not in answer and len(answer) < 1000
    assert _http("GET", url + "/v1/block", hdr, good)[0] == 200  # the worker still serves


def test_tokens_are_compared_in_constant_time(monkeypatch):
    import hmac

    calls, real = [], hmac.compare_digest
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    assert auth.authorized("Bearer s3cret", "s3cret")
    assert not auth.authorized("Bearer s3cres", "s3cret") and not auth.authorized(None, "s3cret")
    assert calls == [(b"Bearer s3cret", b"Bearer s3cret"), (b"Bearer s3cres", b"Bearer s3cret"),
                     (b"", b"Bearer s3cret")]


def test_block_files_lost_on_workers_are_not_counted_and_warmup_reloads_them(cluster, module_home):
    """Issue 18: cache files deleted or truncated behind a worker's back are not cached (status,
    ``is_cached``); a warmup reloads exactly their blocks, ``check=True`` also a block whose bytes
    changed."""
    plane, contents = cluster
    client = plane.open_dataset(NAME)
    path = "local/big/large.bin"
    entry = client.stat(path)
    client.source.drop()
    assert warmup(client, [path]).ok
    size = len(contents[path])
    assert plane.refresh_status("Dataset", NAME)["cacheStates"]["cached"] == format_bytes(size)
    extents = {}  # block index -> (the worker's cache file of the version, offset, size)
    for wid, directory in worker_dirs(module_home, NAME).items():
        tier = DiskTier(directory, 1 << 40)
        for i in range(len(contents[path]) // BLOCK + 1):
            found = tier.block_extent(str(client.source.key(entry, i)))
            if found:
                extents[i] = found[:3]
        tier.close()
    assert len(extents) == 65
    gone = extents[3][0]  # one worker's file of the version: all its blocks
    os.unlink(gone)
    if extents[64][0] != gone:
        os.truncate(extents[64][0], extents[64][1])  # cut before the last block (7 bytes)
    lost_blocks = [i for i, (name, _, _) in extents.items() if name == gone or i == 64]
    lost = sum(extents[i][2] for i in lost_blocks)
    assert 7 in {extents[i][2] for i in lost_blocks} and len(lost_blocks) < 65
    client.close()

    assert plane.refresh_status("Dataset", NAME)["cacheStates"]["cached"] == format_bytes(size - lost)
    client = plane.open_dataset(NAME)
    assert client.cached_bytes([entry]) == size - lost
    result = warmup(client, [path])
    assert result.ok and result.loaded_bytes == lost
    kept = next(i for i in extents if i not in lost_blocks)  # its file and offset are unchanged
    with open(extents[kept][0], "r+b") as f:  # same size, other bytes
        f.seek(extents[kept][1])
        f.write(b"\xff" * 64)
    assert warmup(client, [path]).loaded_bytes == 0
    assert warmup(client, [path], check=True).loaded_bytes == BLOCK
    assert client.cached_bytes([entry]) == size
    with client.open(path) as f:
        assert f.read() == contents[path]
    client.close()
    assert plane.refresh_status("Dataset", NAME)["cacheStates"]["cached"] == format_bytes(size)
