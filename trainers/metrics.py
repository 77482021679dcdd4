"""Trainer metrics: one structlog line and one ``metrics.jsonl`` line per optimizer step, and Prometheus gauges.

The run directory holds ``config.json`` (the resolved trainer config, with the Orchard config's run, bus and store
minus secrets) and ``metrics.jsonl`` (one JSON object per step, appended and flushed, so a crashed run keeps what it
logged). Prometheus metrics live in a registry of their own (several trainers can share a process in tests) and are
served over HTTP when ``metrics_port`` is set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from orchard.logging import get_logger

if TYPE_CHECKING:
    from trainers.batching import PackedBatch, Sample
    from trainers.losses import LossOutput
    from trainers.staleness import LagStats

log = get_logger("trainers.metrics")

_GAUGES = {
    "loss": "Loss of the last optimizer step",
    "reward_mean": "Mean episode reward of the samples in the last step",
    "advantage_mean": "Mean advantage (RL) or weight (SFT) over the loss tokens of the last step",
    "advantage_std": "Standard deviation of the advantages over the loss tokens of the last step",
    "advantage_min": "Smallest advantage of the last step",
    "advantage_max": "Largest advantage of the last step",
    "clip_fraction": "Fraction of RL tokens whose importance ratio was clipped",
    "kl": "Mean KL estimate to the reference over the loss tokens",
    "grad_norm": "Global gradient norm before clipping",
    "lr": "Learning rate of the last step",
    "tokens_per_second": "Tokens trained per second of the last step (forward, backward, optimizer)",
    "policy_lag_mean": "Mean policy lag of the samples judged in the last step",
    "policy_version": "The trainer's current (last published) policy version",
    "step": "Optimizer steps taken",
}
_COUNTERS = {
    "samples": "Samples trained on",
    "tokens": "Tokens trained on",
    "samples_dropped_stale": "Samples dropped as stale (lag over max_policy_lag)",
    "samples_downweighted_stale": "Samples kept with a reduced weight as stale",
    "samples_skipped": "Samples skipped: undecodable, invalid, too long, or of a kind this trainer does not train",
    "samples_skipped_zero_advantage": "RL samples skipped because every advantage is zero (loss.skip_zero_advantage)",
    "versions_published": "Policy versions published",
    "checkpoints": "Checkpoints saved",
}


class TrainerMetrics:
    """The metrics of one trainer run; see the module docstring."""

    def __init__(self, run_dir: Path, labels: Mapping[str, str], port: int | None = None) -> None:
        self.run_dir = run_dir
        self.registry = CollectorRegistry()
        names = tuple(labels)
        self._labels = dict(labels)
        self.gauges = {k: Gauge(f"orchard_trainer_{k}", d, names, registry=self.registry) for k, d in _GAUGES.items()}
        self.counters = {
            k: Counter(f"orchard_trainer_{k}", d, names, registry=self.registry) for k, d in _COUNTERS.items()
        }
        self.lag = Histogram(
            "orchard_trainer_policy_lag",
            "Policy lag of each sample judged (versions behind the trainer)",
            names,
            buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 32),
            registry=self.registry,
        )
        run_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl: TextIO = open(run_dir / "metrics.jsonl", "a", encoding="utf-8")  # closed in close()
        if port is not None:
            start_http_server(port, registry=self.registry)
            log.info("prometheus metrics served", port=port)

    def write_config(self, resolved: Mapping[str, Any]) -> None:
        """Write the resolved config next to the metrics."""
        (self.run_dir / "config.json").write_text(json.dumps(resolved, indent=2, sort_keys=True, default=str) + "\n")

    def observe_lag(self, lag: int) -> None:
        """Record one sample's policy lag."""
        self.lag.labels(**self._labels).observe(lag)

    def count(self, name: str, amount: float = 1.0) -> None:
        """Add to one of the counters."""
        if amount:
            self.counters[name].labels(**self._labels).inc(amount)

    def set_gauge(self, name: str, value: float) -> None:
        """Set one of the gauges."""
        self.gauges[name].labels(**self._labels).set(value)

    def record_step(self, values: Mapping[str, Any]) -> None:
        """Export a step's values as gauges (those that are gauges), append them to metrics.jsonl, and log them."""
        for key, value in values.items():
            if key in self.gauges and value is not None:
                self.gauges[key].labels(**self._labels).set(float(value))
        self._jsonl.write(json.dumps(dict(values), sort_keys=True) + "\n")
        self._jsonl.flush()
        log.info("step", **{k: round(v, 6) if isinstance(v, float) else v for k, v in values.items()})

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)

    def close(self) -> None:
        """Close the metrics file."""
        self._jsonl.close()


def step_values(
    samples: Sequence[Sample], batches: Sequence[PackedBatch], outputs: Sequence[LossOutput], lags: LagStats
) -> dict[str, Any]:
    """What one step trained, as its metrics line has it (the trainer adds step, time, version, lr and timing)."""
    from trainers.batching import padding_waste  # torch: imported by the trainer that calls this anyway

    rl_tokens = sum(o.rl_tokens for o in outputs)
    loss_tokens = max(1.0, sum(o.loss_tokens for o in outputs))
    advantages = np.concatenate([s.advantages[1:][s.loss_mask[1:] > 0] for s in samples])
    return {
        "loss": sum(float(o.loss.detach()) for o in outputs),
        "samples": len(samples),
        "tokens": sum(s.num_tokens for s in samples),
        "micro_batches": len(batches),
        "padding_waste": padding_waste(batches),
        "reward_mean": float(np.mean([s.reward for s in samples])),
        "advantage_mean": float(advantages.mean()) if advantages.size else 0.0,
        "advantage_std": float(advantages.std()) if advantages.size else 0.0,
        "advantage_min": float(advantages.min()) if advantages.size else 0.0,
        "advantage_max": float(advantages.max()) if advantages.size else 0.0,
        "clip_fraction": sum(o.clipped_tokens for o in outputs) / rl_tokens if rl_tokens else 0.0,
        "ratio_mean": sum(o.ratio_sum for o in outputs) / rl_tokens if rl_tokens else 1.0,
        "kl": sum(o.kl_sum for o in outputs) / loss_tokens,
        "policy_lag_mean": lags.mean,
        "policy_lag_max": lags.maximum,
        "samples_dropped_stale": lags.dropped,
        "samples_downweighted_stale": lags.downweighted,
    }
