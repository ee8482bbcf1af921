"""The layer contracts in pyproject.toml ([tool.importlinter]) hold: every layer of the read path
imports only the layers below it, the core never imports a plugin package, and no sibling modules
import each other in a circle. import-linter (grimp) reads every import, function-level included."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports over the tree at ``root`` (its pyproject.toml, its packages first on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(root / d) for d in (".", "fuse", "runtimes", "operator"))}
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint), "--config", str(root / "pyproject.toml"), "--no-cache"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=120)


def test_layer_contracts_are_kept():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def test_an_upward_import_breaks_the_contract(tmp_path):
    """The check can fail: a copy of the tree where the block cache imports the control plane."""
    for d in ("datacache", "fuse", "runtimes", "operator"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "datacache" / "cache" / "budget.py", "a") as f:
        f.write("\nfrom datacache.control import embedded  # noqa\n")
    result = _lint(tmp_path)
    assert result.returncode == 1, result.stdout
    assert "Read-path layers only point down BROKEN" in result.stdout
    assert "datacache.cache.budget -> datacache.control.embedded" in result.stdout
