"""A ThinRuntime over a real SFTP server through the ``sftp`` plugin (fsspec's sftp, paramiko).

``examples/thin-sftp.yaml`` is applied as a user would (placeholders filled in): warmup, reads
through the cache compared by SHA-256 with the served files, status from what is really cached, a
file changed over SFTP seen after a sync, and host keys pinned by ``known_hosts``.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from datacache.control.embedded import ApplyError
from datacache.errors import UFSUnavailableError
from thin_support import apply_yaml, change_is_seen_after_sync, make_tree, read_all, read_url, sha

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "thin-sftp.yaml")


def example(sshd, served: str, known_hosts: str) -> str:
    with open(EXAMPLE) as f:
        text = f.read()
    for key, value in {"${SFTP_USER}": sshd.user, "${SFTP_HOST}": "127.0.0.1", "${SFTP_PORT}": str(sshd.port),
                       "${SFTP_PATH}": served, "${KNOWN_HOSTS}": known_hosts}.items():
        text = text.replace(key, value)
    return text


def secret_key(home: str, sshd) -> None:
    """The client key as the Secret ``sftp-reader``/``key`` of the example (a file, 0600)."""
    os.makedirs(os.path.join(home, "secrets", "sftp-reader"), mode=0o700)
    shutil.copy(sshd.key_path, os.path.join(home, "secrets", "sftp-reader", "key"))


@pytest.fixture
def sftp_data(sshd, thin_home, tmp_path):
    """The example applied over ``served tree`` (its host key pinned): ``(plane, lines, root, files)``."""
    root = str(tmp_path / "served tree")
    files = make_tree(root)
    known = tmp_path / "known_hosts"
    known.write_text(sshd.host_key_line())
    secret_key(thin_home, sshd)
    plane, lines = apply_yaml(thin_home, example(sshd, root, str(known)))
    return plane, lines, root, files


def test_example_file_warmup_reads_and_status(sftp_data, thin_home):
    plane, lines, _, files = sftp_data
    assert lines == ["thinruntimeprofile.datacache.io/sftp created", "thinruntime.datacache.io/sftp-data created",
                     "dataset.datacache.io/sftp-data created"]

    _, result = plane.warmup("sftp-data", [])
    assert result.ok, [t.failures for t in result.targets]
    assert (result.targets[0].files, result.loaded_bytes) == (len(files), sum(map(len, files.values())))

    client = plane.open_dataset("sftp-data")
    try:
        before = client.source.ufs_bytes
        assert read_all(plane, "sftp-data", files) == sha(files)
        assert client.source.ufs_bytes == before  # everything came from the cache
    finally:
        client.close()
    assert read_url(thin_home, "sftp-data/multi block.bin") == sha(files)["multi block.bin"]

    (ds,) = plane.list("Dataset")
    assert ds["status"]["phase"] == "Bound" and ds["status"]["fileNum"] == len(files)
    assert ds["status"]["cacheStates"]["cachedPercentage"] == "100.0%"
    (rt,) = plane.list("ThinRuntime")
    assert rt["status"]["phase"] == "Ready" and rt["status"]["readyWorkers"] == 1


def test_file_changed_over_sftp_is_seen_after_sync(sshd, sftp_data):
    plane, _, root, files = sftp_data
    change_is_seen_after_sync(sshd, plane, "sftp-data", root, files)


def test_unknown_host_key_is_refused(sshd, thin_home, tmp_path):
    root = str(tmp_path / "served tree")
    make_tree(root)
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    kind, key = (tmp_path / "other_key.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {key}\n")
    secret_key(thin_home, sshd)
    with pytest.raises(ApplyError) as caught:  # the Dataset is stored, its first sync failed
        apply_yaml(thin_home, example(sshd, root, str(known)))
    assert isinstance(caught.value.__cause__, UFSUnavailableError)
    message = str(caught.value)
    assert "thinruntimeprofile 'sftp'" in message and "Host key" in message and "does not match" in message
    with open(sshd.key_path) as f:
        assert f.read().splitlines()[1] not in message
