"""What ``orchard run`` prints when it ends: the outcome, then where the results, the plot, the weights and the
logs are, and how to resume a run that did not complete."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from orchard.bus import open_bus, read_until_quiet
from orchard.codec import Codec
from orchard.config import OrchardConfig
from orchard.logging import get_logger
from orchard.run.live import PublishedWeights, note_weights
from orchard.run.rundir import RunDir
from orchard.topics import POLICY_VERSIONS

RESULTS_MD = "results.md"  # orchard.evaluation.results.RESULTS_MD
REWARD_CURVE_PNG = "reward_curve.png"  # orchard.evaluation.plot.REWARD_CURVE_PNG
IDLE_POLLS_AT_END = 2

log = get_logger("run.summary")


def published_weights(config: OrchardConfig) -> dict[str, PublishedWeights]:
    """The newest weights per model this run published (read from policy-versions; {} if none or unreadable)."""
    weights: dict[str, PublishedWeights] = {}
    try:
        with open_bus(config.bus) as bus:
            if POLICY_VERSIONS not in set(bus.list_topics()):
                return weights
            codec = Codec.default()
            with bus.consumer([POLICY_VERSIONS]) as consumer:
                for record in read_until_quiet(
                    consumer, max_records=1000, poll_timeout_s=0.2, idle_polls=IDLE_POLLS_AT_END
                ):
                    note_weights(record, codec, config.run_id, weights)
    except Exception as exc:  # noqa: BLE001 - the summary must not hide the run's outcome behind a bus error
        log.warning("published weights unreadable", error=f"{type(exc).__name__}: {exc}")
    return weights


def summary_lines(run_dir: RunDir, weights: Mapping[str, PublishedWeights], *, completed: bool) -> list[str]:
    """Where to look after the run: results.md, the reward curve, each model's newest weights, the logs."""
    root = run_dir.root.resolve()
    results, plot = root / RESULTS_MD, root / REWARD_CURVE_PNG
    lines = [
        f"results: {results}" if results.exists() else "results: none (no evaluation wrote results.md)",
        f"plot:    {plot}" if plot.exists() else f"plot:    none yet; draw it: orchard eval --plot --run-dir {root}",
    ]
    for w in sorted(weights.values(), key=lambda w: w.model):
        lines.append(f"weights: {w.model} v{w.version} (trainer step {w.trainer_step}) at {w.uri}")
    if not weights:
        lines.append("weights: none published")
    lines.append(f"logs:    {root / 'logs'}")
    if not completed:
        lines.append(f"resume:  orchard run --resume {root}")
    return lines


def log_tail(path: Path, count: int = 8, width: int = 300) -> list[str]:
    """The last ``count`` non-blank lines of a component's log (each cut at ``width`` characters); [] if none."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))  # the end is enough; a log can be large
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return [line if len(line) <= width else line[: width - 3] + "..." for line in lines[-count:]]
