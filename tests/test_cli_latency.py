"""CLI start-up cost (issue 19.3): every ``datacache`` call paid 2-5 s importing the whole stack.

Speed itself is measured, not asserted (``python -X importtime -m datacache --help``); what a test
can hold is which modules a command loads. Each command runs in a fresh interpreter, as a user runs
it, and reports ``sys.modules`` at its end.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import dataset_yaml

# The heavy ones: each costs 0.1-0.6 s to import here; torch and kopf are never needed by the CLI.
# (Reading the manifest loads pyarrow, and pyarrow.parquet.read_table its dataset module.)
NEVER = ("torch", "kopf", "aiohttp", "boto3", "botocore", "aiobotocore", "s3fs")
HELP_NEVER = NEVER + ("pyarrow", "pyarrow.dataset", "pydantic", "fsspec", "rich", "numpy",
                      "datacache.control.embedded")

_PROBE = """
import json, sys
from datacache.cli import main
sys.argv = ["datacache", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit as exit:
    code = exit.code
print("\\nMODULES " + json.dumps(sorted(sys.modules)), code)
"""


def loaded_by(args: list[str], home) -> set[str]:
    """The modules a ``datacache ARGS`` run had imported when it ended (it must succeed)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args)], capture_output=True, timeout=120,
                          env={**os.environ, "DATACACHE_HOME": str(home)})
    out = proc.stdout.decode()
    assert proc.returncode == 0 and out.rstrip().endswith(" 0"), (out, proc.stderr.decode())
    return set(json.loads(out[out.rindex("MODULES ") + 8:].rsplit(" ", 1)[0]))


def _heavy(modules: set[str], names: tuple[str, ...]) -> list[str]:
    return sorted(n for n in names if n in modules)


def test_help_imports_no_heavy_module(datacache_home):
    for args in (["--help"], ["warmup", "--help"], ["get", "--help"]):
        assert _heavy(loaded_by(args, datacache_home), HELP_NEVER) == [], args


@pytest.mark.parametrize("args", [["get", "datasets"], ["get", "runtimes", "-o", "wide"],
                                  ["describe", "dataset", "photos"], ["ls", "-l", "photos/train"]],
                         ids=lambda a: " ".join(a))
def test_status_and_listing_commands_import_no_network_stack(args, datacache_home, tmp_path):
    (tmp_path / "src" / "train").mkdir(parents=True)
    (tmp_path / "src" / "train" / "a.jpg").write_bytes(b"x" * 1000)
    (tmp_path / "photos.yaml").write_text(dataset_yaml("photos", [{"name": "local", "mountPoint": str(tmp_path / "src")}],
                                                       [{"mediumtype": "SSD", "path": "cache", "quota": "64Mi"}]))
    apply = subprocess.run([sys.executable, "-m", "datacache", "apply", "-f", str(tmp_path / "photos.yaml")],
                           capture_output=True, env={**os.environ, "DATACACHE_HOME": str(datacache_home)})
    assert apply.returncode == 0, apply.stderr.decode()
    # A local dataset on an in-process cache: no worker to call, no object store to open.
    assert _heavy(loaded_by(args, datacache_home), NEVER) == []
