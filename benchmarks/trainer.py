"""Policy trainer benchmark: throughput beside a bare torch loop, step-to-PolicyVersion latency, S3 publish speed.

Three tables, all in one run on models built here (nothing is downloaded):

- **throughput**: the policy trainer (``PolicyTrainer.run`` on an embedded bus holding a fixed stream of synthetic
  RL + SFT samples: poll, decode, staleness, packing, loss, AdamW, metrics) against a bare torch loop over the *same*
  steps (the same samples, packed the same way, same loss, ``AdamW``), in the same process. Tokens/s counts the
  samples' tokens from the end of the first step (warm-up) to the end of the last; the trainer's figure includes
  everything between steps (polling, decoding, batching, metrics). Best of ``--repeats`` interleaved runs: on a
  shared machine other load only ever slows a run down. Target ratio >= 0.9;
- **publish latency**: seconds from the end of an optimizer step to its ``PolicyVersion`` record being on the bus
  (the record's append timestamp), with the weights going to a local store and to S3 (SeaweedFS);
- **S3 upload**: MB/s of ``publish_policy_version`` for one weights file of ``--publish-mb`` MB beside a plain
  ``minio`` ``fput_object`` of the same file (same part size), to the same server.

SeaweedFS is started through ``infra/local/services.py`` (name ``bench-s3``) unless ``ORCHARD_S3_ENDPOINT`` is set.

    python benchmarks/trainer.py [--model tiny-llama] [--steps 30] [--batch-tokens 1024] [--threads 2]
                                 [--repeats 2] [--publish-mb 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from minio import Minio
from rich.console import Console
from rich.table import Table
from safetensors.torch import save_file

from orchard.bus import open_bus
from orchard.codec import Codec
from orchard.config import EmbeddedBusConfig, LocalStoreConfig, OrchardConfig, S3StoreConfig
from orchard.logging import configure_logging
from orchard.store import open_store
from orchard.topics import POLICY_VERSIONS
from trainers.batching import Sample, pack_step, sample_from_record
from trainers.config import PolicyTrainerConfig, TinyModelSource
from trainers.losses import packed_loss, token_logprobs
from trainers.model import load_policy_model
from trainers.policy import PolicyTrainer
from trainers.synthetic import produce_samples, synthetic_stream
from trainers.weights import publish_policy_version

REPO = Path(__file__).resolve().parents[1]
console = Console()
VOCAB = 420
LENGTHS = (96, 160, 256, 384, 200, 128)


def stream(count: int) -> list[dict[str, Any]]:
    """The fixed stream of samples every run trains on."""
    return synthetic_stream(count, run_id="bench", kinds=("RL", "SFT"), vocab_size=VOCAB, lengths=LENGTHS, seed=7)


def form_steps(samples: list[Sample], budget: int, steps: int) -> list[list[Sample]]:
    """The trainer's step rule (arrival order, until the next sample would overflow ``budget``), for the bare loop."""
    out: list[list[Sample]] = [[]]
    tokens = 0
    for sample in samples:
        if out[-1] and tokens + sample.num_tokens > budget:
            if len(out) == steps:
                break
            out.append([])
            tokens = 0
        out[-1].append(sample)
        tokens += sample.num_tokens
    return out[:steps]


def trainer_config(args: argparse.Namespace, run_dir: Path, **overrides: Any) -> PolicyTrainerConfig:
    """The trainer's config for a benchmark run."""
    settings: dict[str, Any] = {
        "model": {"type": "tiny", "name": args.model},
        "run_dir": run_dir,
        "batch_tokens": args.batch_tokens,
        "grad_accum": 2,
        "lr": 1e-4,
        "max_steps": args.steps,
        "publish_every": 10**6,
        "checkpoint_every": 10**6,
        "publish_on_exit": False,
        "idle_flush_s": 0.5,
        "poll_timeout_s": 0.05,
        "device": args.device,
        "cpu_threads": args.threads,
    }
    return PolicyTrainerConfig.model_validate(settings | overrides)


def run_trainer(args: argparse.Namespace, records: list[dict[str, Any]]) -> float:
    """Tokens/s of ``PolicyTrainer`` from the end of step 1 to the end of the last step."""
    with tempfile.TemporaryDirectory(prefix="bench-trainer-") as tmp:
        root = Path(tmp)
        orchard = OrchardConfig(
            run_id="bench", bus=EmbeddedBusConfig(path=root / "bus"), store=LocalStoreConfig(path=root / "store")
        )
        with open_bus(orchard.bus) as bus:
            produce_samples(bus, "samples", records)
        PolicyTrainer(trainer_config(args, root / "run"), orchard).run()
        steps = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    tokens = sum(s["tokens"] for s in steps[1:])
    return tokens / (steps[-1]["time"] - steps[0]["time"])


def run_bare(args: argparse.Namespace, records: list[dict[str, Any]]) -> float:
    """Tokens/s of a bare loop (pack, forward, loss, backward, clip, AdamW) over the trainer's steps."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    model = load_policy_model(TinyModelSource(name=args.model)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    samples = [sample_from_record(r) for r in records]
    steps = form_steps(samples, args.batch_tokens * 2, args.steps)
    times: list[float] = []
    for step in steps:
        normalizer = float(sum(s.num_loss_tokens for s in step))
        for batch in pack_step(step, args.batch_tokens):
            batch = batch.to(device)
            logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False).logits
            packed_loss(token_logprobs(logits, batch.targets), batch, normalizer=normalizer).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter())
    tokens = sum(s.num_tokens for step in steps[1:] for s in step)
    return tokens / (times[-1] - times[0])


def throughput(args: argparse.Namespace) -> tuple[float, float]:
    """Best-of-``repeats`` tokens/s of the trainer and of the bare loop, interleaved."""
    records = stream(args.steps * 12)
    trainer, bare = [], []
    for repeat in range(args.repeats):
        trainer.append(run_trainer(args, records))
        bare.append(run_bare(args, records))
        console.log(f"throughput run {repeat + 1}: trainer {trainer[-1]:,.0f} tokens/s, bare {bare[-1]:,.0f}")
    return max(trainer), max(bare)


def publish_latency(args: argparse.Namespace, store_config: LocalStoreConfig | S3StoreConfig) -> list[float]:
    """Seconds from each step's end to its PolicyVersion's append on the bus (publishing after every step)."""
    with tempfile.TemporaryDirectory(prefix="bench-publish-") as tmp:
        root = Path(tmp)
        if isinstance(store_config, LocalStoreConfig):
            store_config = LocalStoreConfig(path=root / "store")
        orchard = OrchardConfig(run_id="bench", bus=EmbeddedBusConfig(path=root / "bus"), store=store_config)
        with open_bus(orchard.bus) as bus:
            produce_samples(bus, "samples", stream(args.publishes * 14))
        config = trainer_config(args, root / "run", max_steps=args.publishes, publish_every=1)
        PolicyTrainer(config, orchard).run()
        lines = (root / "run" / "metrics.jsonl").read_text().splitlines()
        ends = {s["step"]: s["time"] for s in map(json.loads, lines)}
        with open_bus(orchard.bus) as bus, bus.consumer([POLICY_VERSIONS]) as consumer:
            records = consumer.poll(max_records=1000, timeout_s=2.0)
    decoded = [(Codec.default().decode(r.value).record, r.timestamp_ms) for r in records]
    return [stamp / 1000 - ends[rec["trainer_step"]] for rec, stamp in decoded]


def s3_upload(args: argparse.Namespace, endpoint: str, access: str, secret: str) -> tuple[float, float]:
    """MB/s of ``publish_policy_version`` and of a plain minio ``fput_object`` for the same weights file."""
    config = S3StoreConfig(endpoint=endpoint, bucket=f"bench-{os.getpid()}", access_key=access, secret_key=secret)
    with tempfile.TemporaryDirectory(prefix="bench-s3-") as tmp:
        path = Path(tmp) / "model.safetensors"
        count = args.publish_mb * 1024 * 1024 // 4
        save_file({"weight": torch.randn(count // 1024, 1024)}, path)
        size_mb = path.stat().st_size / 1e6
        ours, plain = [], []
        with open_store(config) as store, open_bus(EmbeddedBusConfig(path=Path(tmp) / "bus")) as bus:
            bus.create_topic(POLICY_VERSIONS, 1)
            producer = bus.producer()
            client = Minio(endpoint, access_key=access, secret_key=secret, secure=False)
            for version in range(1, args.repeats + 1):
                start = time.perf_counter()
                publish_policy_version(
                    store, producer, run_id="bench", model="policy", version=version,
                    files={"model.safetensors": path}, trainer_step=version,
                )  # fmt: skip
                ours.append(size_mb / (time.perf_counter() - start))
                start = time.perf_counter()
                client.fput_object(
                    config.bucket, f"plain/{version}/model.safetensors", str(path),
                    part_size=config.part_size, num_parallel_uploads=config.parallel_uploads,
                )  # fmt: skip
                plain.append(size_mb / (time.perf_counter() - start))
            producer.close()
            store.delete_prefix("runs/")
            store.delete_prefix("plain/")
    return max(ours), max(plain)


def s3_endpoint() -> tuple[str, str, str, Callable[[], None]]:
    """An S3 endpoint: ``$ORCHARD_S3_ENDPOINT`` or a SeaweedFS started here (stopped by the returned callable)."""
    spec = importlib.util.spec_from_file_location("orchard_services", REPO / "infra" / "local" / "services.py")
    assert spec is not None and spec.loader is not None
    services = importlib.util.module_from_spec(spec)
    sys.modules["orchard_services"] = services
    spec.loader.exec_module(services)
    if os.environ.get("ORCHARD_S3_ENDPOINT"):
        access = os.environ.get("ORCHARD_S3_ACCESS_KEY", services.S3_ACCESS_KEY)
        secret = os.environ.get("ORCHARD_S3_SECRET_KEY", services.S3_SECRET_KEY)
        return os.environ["ORCHARD_S3_ENDPOINT"], access, secret, lambda: None
    service = services.s3_up(name="bench-s3", fresh=True)
    return service.endpoint, service.access_key, service.secret_key, lambda: services.s3_down("bench-s3", purge=True)


def main() -> None:
    """Run the benchmark and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-llama", help="Tiny-family model to train.")
    parser.add_argument("--steps", type=int, default=12, help="Optimizer steps per throughput run.")
    parser.add_argument("--batch-tokens", type=int, default=512, help="Tokens per micro-batch (2 per step).")
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--publishes", type=int, default=4, help="Versions published in the latency runs.")
    parser.add_argument("--publish-mb", type=int, default=32, help="Size of the weights file uploaded to S3.")
    args = parser.parse_args()
    configure_logging("console", "WARNING")

    trainer, bare = throughput(args)
    table = Table(title=f"policy trainer throughput ({args.model}, {args.steps} steps, {args.device})")
    for column in ("loop", "tokens/s", "ratio"):
        table.add_column(column)
    table.add_row("bare torch loop", f"{bare:,.0f}", "1.00")
    table.add_row("PolicyTrainer", f"{trainer:,.0f}", f"{trainer / bare:.2f}")
    console.print(table)

    endpoint, access, secret, stop = s3_endpoint()
    try:
        s3 = S3StoreConfig(endpoint=endpoint, bucket=f"bench-lat-{os.getpid()}", access_key=access, secret_key=secret)
        latency = Table(title=f"step -> PolicyVersion on the bus ({args.model}, {args.publishes} versions)")
        for column in ("store", "median s", "max s"):
            latency.add_column(column)
        for name, store_config in (("local", LocalStoreConfig()), ("s3 (SeaweedFS)", s3)):
            seconds = publish_latency(args, store_config)
            latency.add_row(name, f"{statistics.median(seconds):.3f}", f"{max(seconds):.3f}")
        console.print(latency)
        ours, plain = s3_upload(args, endpoint, access, secret)
    finally:
        stop()
    upload = Table(title=f"weights upload to S3 ({args.publish_mb} MB file, best of {args.repeats})")
    for column in ("path", "MB/s", "ratio"):
        upload.add_column(column)
    upload.add_row("plain minio fput_object", f"{plain:,.1f}", "1.00")
    upload.add_row("publish_policy_version", f"{ours:,.1f}", f"{ours / plain:.2f}")
    console.print(upload)


if __name__ == "__main__":
    main()
