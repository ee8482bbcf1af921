"""Case C10: cache directories are 0700 and block files 0600; another local user reads nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from support import apply_dataset

NOBODY = 65534


def _modes(root):
    for dirpath, dirs, files in os.walk(root):
        yield dirpath, stat.S_IMODE(os.stat(dirpath).st_mode), True
        for f in files:
            yield os.path.join(dirpath, f), stat.S_IMODE(os.stat(os.path.join(dirpath, f)).st_mode), False


def test_c10_cache_and_state_are_private(datacache_home, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "secret-data.bin").write_bytes(os.urandom(3 << 20))
    plane = apply_dataset(datacache_home, "priv", [{"name": "local", "mountPoint": str(src)}])
    client = plane.open_dataset("priv")
    assert len(client.open("secret-data.bin").read()) == 3 << 20
    entry = client.stat("secret-data.bin")
    block = client.source.store.block_file(str(client.source.key(entry, 0)))
    client.close()

    seen_block = False
    for path, mode, is_dir in _modes(datacache_home):
        if is_dir:
            assert mode == 0o700, f"{path} is {oct(mode)}"
        else:
            assert mode & 0o077 == 0, f"{path} is {oct(mode)}"
            seen_block |= path == block
    assert seen_block and stat.S_IMODE(os.stat(block).st_mode) == 0o600

    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second user (CI runs as root)")
    # A second local user: cannot list the cache directory or read a block even by its exact path.
    for target in (block, os.path.dirname(block), str(datacache_home)):
        proc = subprocess.run(
            [sys.executable, "-c", f"import os; os.setgid({NOBODY}); os.setuid({NOBODY}); "
                                   f"p = {target!r}; os.listdir(p) if os.path.isdir(p) else open(p, 'rb').read()"],
            capture_output=True, timeout=30)
        assert proc.returncode != 0 and b"PermissionError" in proc.stderr, (target, proc.stderr)
