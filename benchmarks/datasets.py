"""Dataset import and export throughput, and peak memory, on a generated trajectory file.

Generates a Parquet file in the ``orchard-swe`` layout (system + task, then ``--turns`` assistant turns each calling
a shell tool and reading its output; ``metadata`` as a JSON string, ``verify_status``), imports it into an embedded
bus with the tiny tokenizer, then exports the episodes to Parquet and to JSONL. Prints rows/s, calls/s, tokens/s and
the peak resident memory of each phase (sampled every row), with the sizes used.

    python benchmarks/datasets.py [--rows 10000] [--turns 4] [--keep DIR]

The default is 10,000 trajectories, not the 100,000 of the issue: on two shared cores the import runs at ~80-130
rows/s (chat-template rendering and BPE tokenization of every prompt), so 100,000 rows take 15-20 minutes; pass
``--rows 100000`` for the full size.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this folder comes first on sys.path, where this file would shadow Hugging Face `datasets` and
# a benchmarks/consumers.py the `consumers` package: look modules up from the repository root instead.
_HERE = Path(__file__).resolve().parent
if __name__ == "__main__":
    sys.path[:] = [str(_HERE.parent)] + [p for p in sys.path if Path(p or ".").resolve() != _HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import resource  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from orchard.bus import open_bus  # noqa: E402
from orchard.config import EmbeddedBusConfig  # noqa: E402
from orchard.datasets.conversation import ChatTokenizer  # noqa: E402
from orchard.datasets.exporter import ExportSelection, export_trajectories  # noqa: E402
from orchard.datasets.importer import DatasetImporter  # noqa: E402
from orchard.datasets.layouts import layout_with_overrides  # noqa: E402
from orchard.topics import DEAD_LETTERS, MODEL_CALLS, OUTCOMES  # noqa: E402

console = Console(width=150)
WORDS = "the test fails because the parser drops the last line so we read the file and fix the loop".split()
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mb() -> float:
    """Resident memory of this process now, in MiB."""
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * PAGE / 2**20


class PeakRss:
    """The highest resident memory seen by ``sample`` calls (sampled, unlike ru_maxrss, per phase)."""

    def __init__(self, every: int = 50) -> None:
        self.every, self.count, self.peak, self.start = every, 0, rss_mb(), rss_mb()

    def sample(self) -> None:
        """Count one row; read the RSS every ``every`` rows."""
        self.count += 1
        if self.count % self.every == 0:
            self.peak = max(self.peak, rss_mb())


def trajectory(rng: np.random.Generator, index: int, turns: int) -> dict[str, Any]:
    """One SWE-style trajectory row in the orchard-swe layout."""

    def sentence(n: int) -> str:
        return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), size=n))

    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a software engineer. Use the shell tool."},
        {"role": "user", "content": f"Issue {index}: {sentence(40)}"},
    ]
    for turn in range(turns):
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "shell", "arguments": '{"command": "ls"}'}}
        messages.append({"role": "assistant", "content": sentence(30), "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{turn}", "content": sentence(60)})
    messages.append({"role": "assistant", "content": "The fix is in place."})
    metadata = {"instance_id": f"repo__{index % 997}", "signals": {"tests_passed_fraction": float(index % 5) / 4}}
    return {"messages": json.dumps(messages), "metadata": json.dumps(metadata), "verify_status": index % 3 != 0}


def generate(path: Path, rows: int, turns: int) -> None:
    """Write ``rows`` trajectories to ``path`` (Parquet, row groups of 1,000)."""
    rng = np.random.default_rng(0)
    with pq.ParquetWriter(path, pa.schema([("messages", pa.string()), ("metadata", pa.string()),
                                           ("verify_status", pa.bool_())])) as writer:  # fmt: skip
        for start in range(0, rows, 1000):
            batch = [trajectory(rng, i, turns) for i in range(start, min(rows, start + 1000))]
            writer.write_table(pa.Table.from_pylist(batch, schema=writer.schema))


def main() -> None:
    """Generate, import, export; print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows", type=int, default=10_000, help="trajectories in the generated file (100,000: ~20 min on 2 busy cores)"
    )
    parser.add_argument("--turns", type=int, default=4, help="tool-calling turns per trajectory (calls = turns + 1)")
    parser.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    args = parser.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="orchard-bench-datasets-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        run(work, args.rows, args.turns)
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


def run(work: Path, rows: int, turns: int) -> None:
    """The benchmark proper, in ``work``."""
    source = work / "swe.parquet"
    started = time.perf_counter()
    generate(source, rows, turns)
    console.print(
        f"generated {rows:,} trajectories ({turns + 1} calls each) in {time.perf_counter() - started:.1f}s: "
        f"{source.stat().st_size / 2**20:.1f} MiB Parquet"
    )
    tokenizer = ChatTokenizer.load("tiny")
    bus = open_bus(EmbeddedBusConfig(path=work / "bus", fsync="never"))
    table = Table("phase", "rows", "rows/s", "calls/s", "tokens/s", "seconds", "peak RSS MiB", "RSS growth MiB")
    try:
        for name in (MODEL_CALLS, OUTCOMES, DEAD_LETTERS):
            bus.create_topic(name, 4, exist_ok=True)
        producer = bus.producer()
        importer = DatasetImporter(producer, layout_with_overrides("orchard-swe"), run_id="bench", tokenizer=tokenizer)
        peak = PeakRss()
        stats = importer.import_files([source], on_row=peak.sample)
        producer.close()
        table.add_row(
            "import (orchard-swe, tiny tokenizer)", f"{stats.rows:,}", f"{stats.rows_per_s:,.0f}",
            f"{stats.calls / stats.seconds:,.0f}", f"{stats.tokens / stats.seconds:,.0f}", f"{stats.seconds:.1f}",
            f"{peak.peak:.0f}", f"{peak.peak - peak.start:.0f}",
        )  # fmt: skip
        for fmt in ("parquet", "jsonl"):
            peak = PeakRss()
            out = work / f"export.{fmt}"
            exported = export_trajectories(bus, out, fmt, ExportSelection(run_id="bench"), on_episode=peak.sample)
            table.add_row(
                f"export ({fmt}, {out.stat().st_size / 2**20:.0f} MiB)", f"{exported.episodes:,}",
                f"{exported.rows_per_s:,.0f}", f"{exported.calls / exported.seconds:,.0f}", "",
                f"{exported.seconds:.1f}", f"{peak.peak:.0f}", f"{peak.peak - peak.start:.0f}",
            )  # fmt: skip
    finally:
        bus.close()
    console.print(table)
    console.print(f"process peak RSS (ru_maxrss): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
