"""Loading a benchmark script by path, as the integration tests do, leaves the importing process as it was."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"

# One process loads every script that reaches its siblings through sys.path, then imports the package one of them
# could shadow (benchmarks/datasets.py against Hugging Face `datasets`).
PROBE = """
import importlib.util, json, sys
before = list(sys.path)
changed = {}
for path in sys.argv[1:]:
    spec = importlib.util.spec_from_file_location("probe_" + path.rsplit("/", 1)[-1][:-3], path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    if sys.path != before:
        changed[path] = [entry for entry in sys.path if entry not in before]
        sys.path[:] = before
import datasets
print(json.dumps({"changed": changed, "datasets": datasets.__file__}))
"""


def test_benchmark_scripts_loaded_by_path_leave_sys_path_and_installed_packages_alone() -> None:
    scripts = sorted(str(path) for path in BENCHMARKS.glob("*.py") if "sys.path" in path.read_text())
    assert len(scripts) >= 6  # the scripts that import recipe_runs, and the two that filter their own folder out
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *scripts], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["changed"] == {}
    assert not report["datasets"].startswith(str(BENCHMARKS))
