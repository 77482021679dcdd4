"""Orchard's policy trainer beside TRL's ``GRPOTrainer``: the same task, model, seed and settings; reward per episode
and per second.

What it measures. Both trainers learn the copy task of ``benchmarks/copy_task.py`` (a prompt names a digit among two
distractors, ``"3/5 copy=7:"``; reward 1 for answering it, else 0) from the same warm-started tiny model, on the
same sequence of training prompts. Printed: for each tenth of the run, the mean training reward (sampled at
temperature 1), when it was reached (seconds into training) and the greedy success on 100 held-out prompts of the
weights at that point; then each trainer's wall time, episodes/s and final success, and the ratios Orchard/TRL.
A PNG of both curves (reward against episodes and against seconds) goes to ``--out``.
Each trainer runs ``--repeats`` times, interleaved, and its fastest run is reported: on a shared machine other load
only ever slows a run down, and both are deterministic here (the same rewards every run) with ``--max-lag 0``; with
``--max-lag 1`` which version sampled a step depends on timing, so Orchard's curve varies between runs.

Orchard's side is its real path, in one process: a ``LocalEngine`` samples each step's groups from the policy it
serves; the sampler scores them, turns each completion into an RL ``TrainingSample`` (group-relative advantage,
the engine's behaviour logprobs, loss mask on the completion) and produces it to the ``samples`` topic of an
embedded bus; ``PolicyTrainer.run`` (a thread, its own bus and store handles) consumes them, takes one optimizer step
per step's samples (one padded micro-batch, ``layout: padded``), publishes every version to a local store
(``--store-fsync never``: without fsyncs, as the embedded bus by default) and a ``PolicyVersion`` to the bus; a
``PolicyReloader`` fetches, verifies and installs each version in the engine. With ``--max-lag 0`` (the default,
on-policy like TRL) the sampler waits for version ``k`` before sampling step ``k``; with ``--max-lag 1`` it samples
step ``k`` from version ``k - 1`` while the trainer trains step ``k - 1`` (Orchard's asynchronous mode; the PPO
ratio then corrects for the lag).

TRL's side: ``GRPOTrainer`` with ``use_vllm=False`` on the CPU; it generates with ``model.generate``, scores with
the same reward function, and takes one optimizer step per generation batch (``num_iterations=1``).

Matched settings: the warm start and the prompt sequence; ``--group`` completions per prompt (TRL's
``num_generations``), ``--prompts-per-step`` prompts per optimizer step, one new token per completion, temperature
1 (no top-p/top-k); AdamW at a constant ``--lr`` (TRL's default schedule, linear decay, is turned off), weight decay
0, gradient clipping at 1.0; advantages ``(r - mean) / (std + 1e-4)`` with the sample std (Orchard's
``group_advantages(eps=1e-4, ddof=1)`` = TRL's ``scale_rewards="group"``); the clipped surrogate with
``clip_eps = epsilon = epsilon_high = 0.2``, no KL (``beta=0``), token-level normalisation over the step (TRL's
``loss_type="bnpo"``); fp32. Departure from Orchard's sample builder: zero-advantage samples are published too (its
``emit_zero_samples: true``), so both losses divide by the same token count (the builder's default drops them,
which scales up the step of a batch with many uniform groups).

    python benchmarks/rl_vs_trl.py [--episodes 6400] [--group 8] [--prompts-per-step 4] [--lr 1e-3] [--seed 0]
                                   [--max-lag 0] [--store-fsync always] [--repeats 2] [--model tiny-llama-micro]
                                   [--out .orchard/bench/rl_vs_trl.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

HERE = Path(__file__).resolve().parent
# its sibling module, found last (python puts benchmarks/ first, and benchmarks/datasets.py would shadow
# ``datasets``); the folder then leaves sys.path, so a test that loads this file by path finds what it found before
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE] + [str(HERE)]
from copy_task import PROMPT_TOKENS, Prompt, copy_reward, greedy_success, split, training_prompts, warm_start  # noqa: E402

sys.path.remove(str(HERE))

from consumers.advantages import group_advantages  # noqa: E402
from orchard.artifacts import policy_artifact_name  # noqa: E402
from orchard.bus import Producer, open_bus  # noqa: E402
from orchard.clock import now_ms  # noqa: E402
from orchard.codec import Codec  # noqa: E402
from orchard.config import EmbeddedBusConfig, LocalStoreConfig, OrchardConfig  # noqa: E402
from orchard.engines.batching import Completion  # noqa: E402
from orchard.engines.local import LocalEngine  # noqa: E402
from orchard.engines.reload import PolicyReloader  # noqa: E402
from orchard.engines.sampling import SamplingParams  # noqa: E402
from orchard.engines.tiny import build_tiny_tokenizer  # noqa: E402
from orchard.logging import configure_logging, get_logger  # noqa: E402
from orchard.store import open_store  # noqa: E402
from orchard.tokens import pack_array  # noqa: E402
from orchard.topics import SAMPLES, TOPICS_BY_NAME  # noqa: E402
from trainers.config import CheckpointModelSource, PolicyTrainerConfig  # noqa: E402
from trainers.policy import PolicyTrainer, RunSummary  # noqa: E402

log = get_logger("benchmarks.rl_vs_trl")

RUN_ID, MODEL_NAME = "rl-vs-trl", "policy"
MAX_NEW_TOKENS = 1
CLIP_EPS = 0.2
ADVANTAGE_EPS, ADVANTAGE_DDOF = 1e-4, 1  # TRL's scale_rewards="group"
POINTS = 10
"""Evaluation points: the run is cut into this many equal parts."""
THRESHOLD = 0.5
"""Held-out success whose first crossing is reported in episodes and seconds."""


@dataclass(frozen=True)
class Settings:
    """The matched settings of one comparison."""

    steps: int
    group: int
    prompts_per_step: int
    lr: float
    seed: int
    max_lag: int
    store_fsync: Literal["always", "never"] = "always"

    @property
    def batch(self) -> int:
        """Completions (episodes) per optimizer step."""
        return self.group * self.prompts_per_step

    @property
    def eval_steps(self) -> list[int]:
        """Steps after which the weights are evaluated (0: the warm start)."""
        return sorted({round(self.steps * i / POINTS) for i in range(POINTS + 1)})


@dataclass
class Run:
    """What one trainer did: each step's rewards and when they were scored, held-out success at ``eval_steps``."""

    name: str
    rewards: list[list[float]] = field(default_factory=list)
    scored_at: list[float] = field(default_factory=list)
    success: dict[int, float] = field(default_factory=dict)
    wall_s: float = 0.0
    setup_s: float = 0.0
    notes: list[str] = field(default_factory=list)

    def reward_between(self, first: int, last: int) -> float:
        """Mean training reward of steps ``first`` to ``last - 1``."""
        values = [r for step in self.rewards[first:last] for r in step]
        return float(np.mean(values)) if values else float("nan")

    def first_reaching(self, threshold: float, steps: list[int]) -> int | None:
        """The first evaluated step whose held-out success is at least ``threshold``."""
        return next((s for s in steps if self.success.get(s, 0.0) >= threshold), None)

    def seconds_at(self, step: int) -> float:
        """Seconds into training when step ``step``'s episodes had been scored (0 for the warm start)."""
        return self.scored_at[step - 1] if step > 0 else 0.0


# ------------------------------------------------------------------------------------------------ Orchard


def trainer_config(settings: Settings, checkpoint: Path, run_dir: Path) -> PolicyTrainerConfig:
    """Orchard's trainer: one optimizer step per step's samples, every version published."""
    return PolicyTrainerConfig(
        model=CheckpointModelSource(path=checkpoint), model_name=MODEL_NAME, lr=settings.lr,
        batch_tokens=settings.batch * (PROMPT_TOKENS + MAX_NEW_TOKENS), grad_accum=1, grad_clip=1.0,
        loss={"kind": "rl", "clip_eps": CLIP_EPS}, layout="padded", publish_every=1, checkpoint_every=settings.steps,
        max_steps=settings.steps, idle_flush_s=600.0, poll_timeout_s=0.02, cpu_threads=1, device="cpu",
        seed=settings.seed, run_dir=run_dir,
    )  # fmt: skip


def sample_records(
    prompt: Prompt, completions: list[Completion], tokenizer: PreTrainedTokenizerBase, group_id: str
) -> tuple[list[dict[str, Any]], list[float]]:
    """The RL ``TrainingSample`` records of one prompt's group, and its rewards."""
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in completions]
    rewards = copy_reward(texts, target=[prompt.target] * len(texts))
    advantages = group_advantages(rewards, eps=ADVANTAGE_EPS, ddof=ADVANTAGE_DDOF)
    prompt_zeros = np.zeros(len(prompt.token_ids), dtype=np.float32)
    records = []
    for i, (completion, reward, advantage) in enumerate(zip(completions, rewards, advantages, strict=True)):
        episode = f"{group_id}-e{i}"
        width = len(completion.token_ids)
        records.append({
            "run_id": RUN_ID, "episode_id": episode, "task_id": prompt.text, "group_id": group_id,
            "sample_id": f"{episode}/RL/c0/0-0", "kind": "RL", "policy_version": completion.policy_version,
            "token_ids": pack_array(np.array(prompt.token_ids + tuple(completion.token_ids), dtype=np.int32), "int32"),
            "loss_mask": pack_array(np.concatenate([prompt_zeros, np.ones(width)]).astype(np.uint8), "uint8"),
            "advantages": pack_array(np.concatenate([prompt_zeros, np.full(width, advantage)]), "float32"),
            "behaviour_logprobs": pack_array(np.concatenate([prompt_zeros, completion.logprobs]), "float32"),
            "reward": reward, "created_at": now_ms(),
        })  # fmt: skip
    return records, rewards


class Sampler:
    """Orchard's rollout side: sample each step's groups from the engine, publish them as samples, pace by version."""

    def __init__(self, engine: LocalEngine, producer: Producer, settings: Settings, trainer: threading.Thread) -> None:
        self.engine, self.producer, self.settings, self.trainer = engine, producer, settings, trainer
        self.codec = Codec.default()
        self.lags: list[int] = []
        self.generate_s = self.wait_s = 0.0

    async def run(self, prompts: list[Prompt], run: Run, start: float) -> None:
        """Every step: wait for a recent enough version, sample, score, publish."""
        per_step = self.settings.prompts_per_step
        for step in range(self.settings.steps):
            await self._wait_for_version(step - self.settings.max_lag)
            began = time.perf_counter()
            batch = prompts[step * per_step : (step + 1) * per_step]
            groups = await self._generate(batch, step)
            rewards: list[float] = []
            for j, (prompt, completions) in enumerate(zip(batch, groups, strict=True)):
                records, group_rewards = sample_records(prompt, completions, self.engine.tokenizer, f"s{step}-p{j}")
                for record in records:
                    value = self.codec.encode("TrainingSample", record)
                    self.producer.produce(SAMPLES, value, key=record["episode_id"].encode())
                rewards += group_rewards
                self.lags += [step - c.policy_version for c in completions]
            self.producer.flush()
            self.generate_s += time.perf_counter() - began
            run.rewards.append(rewards)
            run.scored_at.append(time.perf_counter() - start)

    async def _generate(self, batch: list[Prompt], step: int) -> list[list[Completion]]:
        handles = [
            self.engine.submit(
                list(prompt.token_ids),
                SamplingParams(
                    max_tokens=MAX_NEW_TOKENS, temperature=1.0, seed=(self.settings.seed * 10**6 + step) * 1000 + j
                ),
                n=self.settings.group,
            )
            for j, prompt in enumerate(batch)
        ]
        return list(await asyncio.gather(*(handle.completions() for handle in handles)))

    async def _wait_for_version(self, version: int) -> None:
        began = time.perf_counter()
        while self.engine.policy_version < version:
            if not self.trainer.is_alive():
                raise RuntimeError(f"the trainer stopped before publishing version {version}")
            await asyncio.sleep(0.001)
        self.wait_s += time.perf_counter() - began


def run_orchard(settings: Settings, checkpoint: Path, prompts: list[Prompt], held_out: list[Prompt]) -> Run:
    """Train with Orchard's sampler -> bus -> ``PolicyTrainer`` -> store -> reloader loop; evaluate its versions."""
    run = Run("Orchard")
    with tempfile.TemporaryDirectory(prefix="rl-vs-trl-orchard-") as tmp:
        root = Path(tmp)
        orchard = OrchardConfig(
            run_id=RUN_ID, bus=EmbeddedBusConfig(path=root / "bus"),
            store=LocalStoreConfig(path=root / "store", fsync=settings.store_fsync),
        )  # fmt: skip
        began = time.perf_counter()
        engine = LocalEngine(checkpoint, model_name=MODEL_NAME, max_batch_size=settings.batch, cpu_threads=1)
        reloader = PolicyReloader(
            engine, open_bus(orchard.bus), open_store(orchard.store), run_id=RUN_ID, model=MODEL_NAME,
            catch_up=False, poll_timeout_s=0.01, download_dir=root / "downloads", owns_backends=True,
        )  # fmt: skip
        trainer = PolicyTrainer(trainer_config(settings, checkpoint, root / "trainer"), orchard)
        summaries: list[RunSummary] = []
        thread = threading.Thread(target=lambda: summaries.append(trainer.run()), name="policy-trainer")
        with open_bus(orchard.bus) as bus, bus.producer() as producer:
            bus.create_topic(SAMPLES, TOPICS_BY_NAME[SAMPLES].partitions, exist_ok=True)
            engine.start()
            reloader.start()
            sampler = Sampler(engine, producer, settings, thread)
            run.setup_s = time.perf_counter() - began
            start = time.perf_counter()
            thread.start()
            try:
                asyncio.run(sampler.run(prompts, run, start))
            finally:
                thread.join()
            run.wall_s = time.perf_counter() - start
        reloader.stop()
        engine.close()
        if not summaries or summaries[0].steps != settings.steps:
            raise RuntimeError(f"the policy trainer did not finish its {settings.steps} steps: {summaries}")
        run.success = evaluate_versions(orchard, settings, checkpoint, held_out, root / "eval")
        steps = [json.loads(line) for line in (root / "trainer" / "metrics.jsonl").read_text().splitlines()]
    lags = np.array(sampler.lags)
    train_s = sum(float(step["seconds"]) for step in steps)
    clipped = np.mean([float(step.get("clip_fraction", 0.0)) for step in steps])
    reload_s = sum(event.seconds for event in reloader.events)
    run.notes += [
        f"trainer: {train_s:.1f} s in optimizer steps (pack, forward, backward, AdamW), clip fraction {clipped:.3f}; "
        f"engine: {reload_s:.1f} s fetching, verifying and loading versions (reloader thread)",
        f"sampler: {sampler.generate_s:.1f} s sampling + publishing samples, {sampler.wait_s:.1f} s waiting for "
        f"versions (training, publishing, reloading); policy lag of the samples: mean {lags.mean():.2f}, "
        f"max {lags.max()}",
        f"versions published {summaries[0].published[-1]}, reloaded by the engine {len(reloader.applied)}, "
        f"refused {len(reloader.refused)}",
    ]
    return run


def evaluate_versions(
    orchard: OrchardConfig, settings: Settings, checkpoint: Path, held_out: list[Prompt], scratch: Path
) -> dict[int, float]:
    """Held-out success of the published version after each evaluated step (version k = after step k)."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    artifact = policy_artifact_name(RUN_ID, MODEL_NAME)
    success = {}
    with open_store(orchard.store) as store:
        for step in settings.eval_steps:
            directory = checkpoint
            if step > 0:
                directory = scratch / f"v{step}"
                store.download_version(artifact, step, directory, verify=True)
            model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)
            success[step] = greedy_success(model, tokenizer, held_out)
    return success


# ------------------------------------------------------------------------------------------------ TRL


def run_trl(settings: Settings, checkpoint: Path, prompts: list[Prompt], held_out: list[Prompt]) -> Run:
    """Train with TRL's ``GRPOTrainer`` on the same prompts; evaluate snapshots taken at the evaluated steps."""
    import trl
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback

    warnings.filterwarnings(
        "ignore", message=r"`(is_)?gradient_checkpointing\w*` is deprecated", category=FutureWarning
    )
    run = Run("TRL")
    began = time.perf_counter()
    start = [0.0]

    def reward(completions: list[str], target: list[str], **kwargs: Any) -> list[float]:
        rewards = copy_reward(completions, target)
        run.rewards.append(rewards)
        run.scored_at.append(time.perf_counter() - start[0])
        return rewards

    snapshots: dict[int, dict[str, torch.Tensor]] = {}

    class Snapshots(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            if state.global_step in settings.eval_steps:
                snapshots[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    with tempfile.TemporaryDirectory(prefix="rl-vs-trl-trl-") as tmp:
        config = trl.GRPOConfig(
            output_dir=tmp, per_device_train_batch_size=settings.batch, gradient_accumulation_steps=1,
            num_generations=settings.group, max_completion_length=MAX_NEW_TOKENS, temperature=1.0, top_p=1.0,
            top_k=0, learning_rate=settings.lr, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0,
            loss_type="bnpo", beta=0.0, epsilon=CLIP_EPS, epsilon_high=CLIP_EPS, scale_rewards="group",
            max_steps=settings.steps, shuffle_dataset=False, use_vllm=False, use_cpu=True, bf16=False,
            report_to=[], save_strategy="no", logging_steps=settings.steps, disable_tqdm=True, seed=settings.seed,
            dataloader_num_workers=0,
        )  # fmt: skip
        dataset = Dataset.from_dict({"prompt": [p.text for p in prompts], "target": [p.target for p in prompts]})
        tokenizer = AutoTokenizer.from_pretrained(checkpoint)
        model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        trainer = trl.GRPOTrainer(
            model=model, reward_funcs=reward, args=config, train_dataset=dataset, processing_class=tokenizer,
            callbacks=[Snapshots()],
        )  # fmt: skip
        trainer.remove_callback(PrinterCallback)
        run.setup_s = time.perf_counter() - began
        start[0] = time.perf_counter()
        trainer.train()
        run.wall_s = time.perf_counter() - start[0]
    evaluated = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    for step in settings.eval_steps:
        if step > 0:
            evaluated.load_state_dict(snapshots[step])
        run.success[step] = greedy_success(evaluated, tokenizer, held_out)
    if len(run.rewards) != settings.steps:
        run.notes.append(f"TRL scored {len(run.rewards)} batches for {settings.steps} steps")
    return run


# ------------------------------------------------------------------------------------------------ report


def report(settings: Settings, runs: tuple[Run, Run], warm: float) -> None:
    """Print the curves, each trainer's figures and the ratios."""
    ours, theirs = runs
    steps = settings.eval_steps
    print(f"\nwarm start (shared): held-out greedy success {warm:.2f}")
    print("\nreward curve (training reward: mean over the episodes since the previous row, sampled at temperature 1;")
    print("held-out: greedy success of the weights after that many episodes; s: seconds into training)")
    columns = f"{'s':>7} {'held-out':>8}"
    header = f"{'episodes':>9} | {'Orchard reward':>14} {columns} | {'TRL reward':>10} {columns}"
    print(header + "\n" + "-" * len(header))
    for before, step in zip(steps, steps[1:], strict=False):
        cells = [
            f"{run.reward_between(before, step):>{width}.3f} {run.seconds_at(step):>7.1f} {run.success[step]:>8.2f}"
            for run, width in ((ours, 14), (theirs, 10))
        ]
        print(f"{step * settings.batch:>9} | {cells[0]} | {cells[1]}")
    print()
    for run in runs:
        episodes = settings.steps * settings.batch
        reached = run.first_reaching(THRESHOLD, steps)
        when = "not reached" if reached is None else (
            f"after {reached * settings.batch} episodes, {run.seconds_at(reached):.1f} s"
        )  # fmt: skip
        print(f"{run.name}: {episodes} episodes in {run.wall_s:.1f} s ({episodes / run.wall_s:.1f} episodes/s; "
              f"setup {run.setup_s:.1f} s), mean training reward {run.reward_between(0, settings.steps):.3f}, "
              f"final held-out success {run.success[steps[-1]]:.2f}, held-out >= {THRESHOLD}: {when}")  # fmt: skip
        for note in run.notes:
            print(f"  {note}")
    print_ratios(settings, ours, theirs)


def print_ratios(settings: Settings, ours: Run, theirs: Run) -> None:
    """Orchard / TRL per episode (reward, success, episodes to the threshold) and per second."""
    last = settings.eval_steps[-1]
    reward = ours.reward_between(0, settings.steps) / max(theirs.reward_between(0, settings.steps), 1e-9)
    success = ours.success[last] / max(theirs.success[last], 1e-9)
    print(f"\nper episode, Orchard/TRL: mean training reward {reward:.2f}, final held-out success {success:.2f}")
    print(f"per second, Orchard/TRL: episodes/s {theirs.wall_s / ours.wall_s:.2f}")
    a, b = ours.first_reaching(THRESHOLD, settings.eval_steps), theirs.first_reaching(THRESHOLD, settings.eval_steps)
    if a is not None and b is not None:
        print(
            f"to held-out >= {THRESHOLD}, TRL/Orchard: episodes {b / max(a, 1):.2f}, "
            f"seconds {theirs.seconds_at(b) / max(ours.seconds_at(a), 1e-9):.2f} (> 1: Orchard got there first)"
        )


def plot(settings: Settings, runs: tuple[Run, Run], out: Path) -> None:
    """Reward curves (a moving mean over a tenth of the run) against episodes and against seconds; held-out dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    window = max(1, settings.steps // POINTS)
    figure, (by_episode, by_second) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for run, colour in zip(runs, ("tab:green", "tab:blue"), strict=True):
        means = np.array([np.mean(step) for step in run.rewards])
        smooth = np.convolve(means, np.ones(window) / window, mode="valid")
        x = np.arange(window, len(means) + 1)
        by_episode.plot(x * settings.batch, smooth, color=colour, label=f"{run.name} training reward")
        by_second.plot(np.array(run.scored_at)[window - 1 :], smooth, color=colour, label=run.name)
        held = settings.eval_steps
        by_episode.plot([s * settings.batch for s in held], [run.success[s] for s in held], "o--", color=colour,
                        alpha=0.6, label=f"{run.name} held-out greedy")  # fmt: skip
        by_second.plot([run.seconds_at(s) for s in held], [run.success[s] for s in held], "o--", color=colour,
                       alpha=0.6)  # fmt: skip
    by_episode.set(xlabel="episodes", ylabel="reward / success", title="per episode")
    by_second.set(xlabel="seconds of training", title="per second")
    by_episode.legend(loc="lower right", fontsize=8)
    figure.suptitle(f"copy task: group {settings.group}, lr {settings.lr}, seed {settings.seed}")
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, dpi=110, bbox_inches="tight")
    print(f"\nplot: {out}")


# ------------------------------------------------------------------------------------------------ main


def run(args: argparse.Namespace) -> int:
    """Warm start once, train with both trainers, report, plot."""
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    settings = Settings(
        steps=args.episodes // (args.group * args.prompts_per_step), group=args.group,
        prompts_per_step=args.prompts_per_step, lr=args.lr, seed=args.seed, max_lag=args.max_lag,
        store_fsync=args.store_fsync,
    )  # fmt: skip
    if settings.steps < POINTS:
        raise SystemExit(f"--episodes {args.episodes} gives {settings.steps} steps; at least {POINTS} are needed")
    with tempfile.TemporaryDirectory(prefix="rl-vs-trl-") as tmp:
        checkpoint = Path(tmp) / "warm"
        pool, held_out = split(build_tiny_tokenizer())
        tokenizer = AutoTokenizer.from_pretrained(warm_start(args.model, pool, args.seed, checkpoint))
        prompts = training_prompts(pool, settings.steps * settings.prompts_per_step, args.seed)
        warm = greedy_success(AutoModelForCausalLM.from_pretrained(checkpoint), tokenizer, held_out)
        print(f"{settings.steps} steps x {settings.batch} episodes ({settings.prompts_per_step} prompts x group "
              f"{settings.group}), lr {settings.lr}, seed {settings.seed}, model {args.model}, Orchard max lag "
              f"{settings.max_lag}, store fsync {settings.store_fsync}; both start from the same warm start: "
              f"{args.model} from seed {args.seed}, "
              "briefly fine-tuned to answer a random digit")  # fmt: skip
        ours, theirs = fastest_runs(settings, checkpoint, prompts, held_out, args.repeats)
    report(settings, (ours, theirs), warm)
    plot(settings, (ours, theirs), args.out)
    return 0


def fastest_runs(
    settings: Settings, checkpoint: Path, prompts: list[Prompt], held_out: list[Prompt], repeats: int
) -> tuple[Run, Run]:
    """Each trainer's fastest of ``repeats`` interleaved runs (other load on a shared machine only slows one down)."""
    ours: list[Run] = []
    theirs: list[Run] = []
    for repeat in range(repeats):
        ours.append(run_orchard(settings, checkpoint, prompts, held_out))
        theirs.append(run_trl(settings, checkpoint, prompts, held_out))
        print(f"run {repeat + 1}/{repeats}: Orchard {ours[-1].wall_s:.1f} s, TRL {theirs[-1].wall_s:.1f} s")
    return min(ours, key=lambda r: r.wall_s), min(theirs, key=lambda r: r.wall_s)


def main() -> int:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=6400, help="Episodes per trainer (steps x prompts x group).")
    parser.add_argument("--group", type=int, default=8, help="Completions per prompt (TRL's num_generations).")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="Prompts (groups) per optimizer step.")
    parser.add_argument("--lr", type=float, default=1e-3, help="Constant AdamW learning rate of both trainers.")
    parser.add_argument("--seed", type=int, default=0, help="Model, warm start, prompts, sampling, trainers.")
    parser.add_argument("--max-lag", type=int, default=0, help="Orchard: versions a sample may lag (0: on-policy).")
    parser.add_argument(
        "--store-fsync",
        choices=["always", "never"],
        default="always",
        help="Orchard's local store: fsync every write (its default) or leave flushing to the OS.",
    )
    parser.add_argument("--repeats", type=int, default=2, help="Interleaved runs of each trainer; the fastest counts.")
    parser.add_argument("--model", default="tiny-llama-micro", help="Tiny-family model (orchard.engines.tiny).")
    parser.add_argument("--out", type=Path, default=Path(".orchard/bench/rl_vs_trl.png"), help="PNG of the curves.")
    parser.add_argument("--log-level", default="WARNING", help="structlog level (the trainer logs every version).")
    args = parser.parse_args()
    configure_logging("console", args.log_level)
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
