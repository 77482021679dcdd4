"""Sandbox start-up cost: what a local sandbox adds to creating one and running a command in it, against a floor.

In one run, alternating, ``--rounds`` times each:

- **create + close**: ``LocalRuntime.create`` of a sandbox from a small task directory, then ``close``;
- **exec**: ``/bin/true`` in a live sandbox (cgroup join, namespaces, allow-list root, seccomp, rlimits, uid drop);
- **exec python**: ``/usr/bin/python3 -c pass`` in a live sandbox (the interpreter starting in the allow-list root);
- **floor**: the same two commands as plain ``subprocess.run`` with no isolation at all.

Prints medians and the ratio to the floor. Run it from two checkouts to compare two versions of the runtime (the
script uses only the public ``LocalRuntime`` API)::

    .venv/bin/python benchmarks/sandbox_startup.py --rounds 100
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from orchard.sandbox import SandboxSpec
from orchard.sandbox.local.runtime import LocalRuntime

PYTHON = "/usr/bin/python3"  # the system interpreter, visible inside every sandbox (a pyenv shim would add 100 ms)


def timed(action: Callable[[], object]) -> float:
    """Milliseconds ``action`` took."""
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000.0


def main() -> None:
    """Measure and print the table."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="orchard-bench-sandbox-") as scratch:
        task = Path(scratch) / "task"
        (task / "pkg").mkdir(parents=True)
        for index in range(20):
            (task / "pkg" / f"m{index}.py").write_text("x = 1\n" * 50)
        runtime = LocalRuntime(Path(scratch) / "sandboxes")
        names = ("create+close", "exec", "exec python", "floor", "floor py")
        rows: dict[str, list[float]] = {name: [] for name in names}
        try:
            live = runtime.create(SandboxSpec(sandbox_id="live", run_id="b", episode_id="b", task_id="t"))
            for index in range(args.rounds):
                spec = SandboxSpec(sandbox_id=f"s{index}", run_id="b", episode_id=f"e{index}", task_id="t",
                                   source_dir=task)  # fmt: skip
                rows["create+close"].append(timed(lambda spec=spec: runtime.create(spec).close()))
                rows["exec"].append(timed(lambda: live.exec(["/bin/true"])))
                rows["exec python"].append(timed(lambda: live.exec([PYTHON, "-c", "pass"])))
                rows["floor"].append(timed(lambda: subprocess.run(["/bin/true"], check=True)))
                rows["floor py"].append(timed(lambda: subprocess.run([PYTHON, "-c", "pass"], check=True)))
        finally:
            runtime.close()
    cgroups = runtime.cgroups.describe() if hasattr(runtime, "cgroups") else "no cgroups"  # an older runtime
    print(f"isolation: {runtime.isolation.describe()}; {cgroups}; {args.rounds} rounds")
    print(f"{'operation':<14} {'median ms':>10} {'p90 ms':>8} {'vs floor':>9}")
    floors = {"exec": "floor", "exec python": "floor py"}
    for name, values in rows.items():
        median = statistics.median(values)
        p90 = statistics.quantiles(values, n=10)[-1]
        floor = statistics.median(rows[floors[name]]) if name in floors else None
        ratio = f"{median / floor:8.1f}x" if floor else ""
        print(f"{name:<14} {median:>10.1f} {p90:>8.1f} {ratio:>9}")


if __name__ == "__main__":
    main()
