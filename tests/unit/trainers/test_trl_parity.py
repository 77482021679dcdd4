"""Orchard's group advantages and clipped policy-gradient loss against TRL's ``GRPOTrainer`` on one fixed batch.

The reference numbers come from TRL's own code at test time: a real ``GRPOTrainer`` (tiny model, CPU) generates
and scores a batch of 2 prompts x 4 completions with fixed rewards (``_generate_and_score_completions``: its
group-relative advantages), then its ``_compute_loss`` gives the loss of that batch once behaviour logprobs are set
so that some ratios fall outside the clip range on either side. Orchard's side is its real path: the same token
sequences as ``TrainingSample``-shaped ``Sample`` objects, packed into one row (``pack_step``), the forward pass with
restarting positions, ``token_logprobs`` and ``packed_loss``.

Settings that match: advantages with the sample std (``ddof=1``) and ``eps=1e-4`` (TRL's ``scale_rewards="group"``;
Orchard's default is the population std, a documented departure, also checked); TRL's ``loss_type="bnpo"``, the
token-level normalisation Orchard uses (TRL's default ``"grpo"`` averages per sequence first); ``epsilon`` and
``epsilon_high`` as Orchard's ``clip_eps`` and ``clip_eps_high``; no KL (``beta=0``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from consumers.advantages import group_advantages
from orchard.engines.tiny import build_tiny_model, build_tiny_tokenizer
from trainers.batching import Sample, pack_step
from trainers.losses import packed_loss, token_logprobs

trl = pytest.importorskip("trl")
# TRL 1.16 still sets transformers' deprecated gradient_checkpointing names; nothing of Orchard's
pytestmark = pytest.mark.filterwarnings("ignore:`(is_)?gradient_checkpointing` is deprecated:FutureWarning")

GROUP = 4
PROMPTS = ["copy 7:", "copy 9:"]
REWARDS = [1.0, 0.0, 0.0, 1.0, 0.25, 0.75, 0.5, 0.0]
"""Fixed rewards of the 8 completions, in TRL's order (each prompt's 4 completions together)."""
CLIP_LOW, CLIP_HIGH = 0.2, 0.28
RATIOS = [0.5, 1.0, 1.25, 1.5, 0.7, 0.9, 1.1, 2.0]
"""pi/mu per completion token position: below 1 - eps, inside, inside only with the higher upper bound, above."""


def fixed_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    """The reward function TRL calls: the fixed rewards, whatever was generated."""
    return REWARDS[: len(completions)]


@pytest.fixture(scope="module")
def trl_batch(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, torch.Tensor]]:
    """A TRL ``GRPOTrainer`` on a tiny model and the batch it generated and scored (advantages included)."""
    from datasets import Dataset

    tokenizer = build_tiny_tokenizer()
    model = build_tiny_model("tiny-llama-micro", tokenizer, seed=0)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path_factory.mktemp("trl")), per_device_train_batch_size=2 * GROUP,
        num_generations=GROUP, max_completion_length=len(RATIOS), loss_type="bnpo", beta=0.0, epsilon=CLIP_LOW,
        epsilon_high=CLIP_HIGH, scale_rewards="group", report_to=[], use_cpu=True, save_strategy="no", seed=0,
        bf16=False,  # TRL's default on a bf16-capable CPU: its logprobs would then be bf16-rounded
    )  # fmt: skip
    dataset = Dataset.from_dict({"prompt": PROMPTS})
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=fixed_reward, args=args, train_dataset=dataset, processing_class=tokenizer
    )
    batch = trainer._generate_and_score_completions([{"prompt": p} for p in PROMPTS for _ in range(GROUP)])
    assert tuple(batch["completion_ids"].shape) == (len(REWARDS), len(RATIOS))  # no completion ended early
    batch["completion_mask"][1, 5:] = 0  # as if the second completion had ended early (EOS)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.training_step sets in a real run
    return trainer, batch


def orchard_samples(batch: dict[str, torch.Tensor], advantages: list[float], behaviour: torch.Tensor) -> list[Sample]:
    """Each prompt + completion as an RL ``Sample``: loss mask, advantage and behaviour logprob on its completion."""
    samples = []
    for i, advantage in enumerate(advantages):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].numpy()
        completion, mask = batch["completion_ids"][i].numpy(), batch["completion_mask"][i].numpy()
        zeros = np.zeros(len(prompt), dtype=np.float32)
        samples.append(
            Sample(
                sample_id=f"s{i}",
                kind="RL",
                policy_version=0,
                token_ids=np.concatenate([prompt, completion]).astype(np.int32),
                loss_mask=np.concatenate([zeros, mask]).astype(np.uint8),
                advantages=np.concatenate([zeros, np.full(len(completion), advantage)]).astype(np.float32),
                behaviour_logprobs=np.concatenate([zeros, behaviour[i].numpy()]).astype(np.float32),
                reward=REWARDS[i],
            )  # fmt: skip
        )
    return samples


def orchard_loss(model: torch.nn.Module, samples: list[Sample]) -> tuple[torch.Tensor, torch.Tensor]:
    """Orchard's loss of ``samples`` packed into one row, and the per-token logprobs of their completions."""
    (row,) = pack_step(samples, batch_tokens=10_000)
    logits = model(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False).logits
    logprobs = token_logprobs(logits, row.targets)
    output = packed_loss(logprobs, row, normalizer=row.loss_tokens, clip_eps=CLIP_LOW, clip_eps_high=CLIP_HIGH)
    ends = np.cumsum([sample.num_tokens for sample in samples])
    # position j predicts token j + 1: a completion's last len(RATIOS) tokens are scored at the positions before them
    completions = [logprobs[0, end - 1 - len(RATIOS) : end - 1] for end in ends]
    return output.loss, torch.stack(completions)


def test_group_advantages_equal_trls_with_the_sample_std(trl_batch: tuple[Any, dict[str, torch.Tensor]]) -> None:
    _, batch = trl_batch
    groups = [REWARDS[i : i + GROUP] for i in range(0, len(REWARDS), GROUP)]

    ours = [a for group in groups for a in group_advantages(group, eps=1e-4, ddof=1)]
    theirs = batch["advantages"].tolist()

    assert ours == pytest.approx(theirs, abs=1e-6)
    assert theirs[:GROUP] == pytest.approx([0.866, -0.866, -0.866, 0.866], abs=1e-3)  # the batch is not trivial
    # Orchard's default (population std, eps 1e-6) is TRL's times sqrt(n / (n - 1)), up to the eps
    default = [a for group in groups for a in group_advantages(group)]
    assert default == pytest.approx([a * math.sqrt(GROUP / (GROUP - 1)) for a in theirs], abs=1e-3)


def test_the_clipped_loss_and_its_gradient_equal_trls(trl_batch: tuple[Any, dict[str, torch.Tensor]]) -> None:
    trainer, batch = trl_batch
    model = trainer.model
    advantages = batch["advantages"].tolist()
    with torch.no_grad():
        _, current = orchard_loss(model, orchard_samples(batch, advantages, torch.zeros(len(REWARDS), len(RATIOS))))
    behaviour = current - torch.log(torch.tensor(RATIOS))  # pi / mu = RATIOS at every completion position
    batch["old_per_token_logps"] = behaviour

    model.zero_grad()
    theirs = trainer._compute_loss(model, batch)
    theirs.backward()
    their_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    ours, _ = orchard_loss(model, orchard_samples(batch, advantages, behaviour))
    ours.backward()
    our_grads = [p.grad.clone() for p in model.parameters()]

    assert ours.item() == pytest.approx(theirs.item(), rel=1e-5, abs=1e-7)
    assert abs(theirs.item()) > 1e-3  # clipping and the asymmetric bound make the loss far from its on-policy 0
    worst = max(
        float((a - b).abs().max() / (b.abs().max() + 1e-12)) for a, b in zip(our_grads, their_grads, strict=True)
    )
    assert worst < 1e-5


def test_the_reference_loss_depends_on_the_clip_bounds(trl_batch: tuple[Any, dict[str, torch.Tensor]]) -> None:
    """The comparison above can fail: with a symmetric bound (Orchard's default) the two losses differ."""
    trainer, batch = trl_batch
    model = trainer.model
    advantages = batch["advantages"].tolist()
    with torch.no_grad():
        _, current = orchard_loss(model, orchard_samples(batch, advantages, torch.zeros(len(REWARDS), len(RATIOS))))
        behaviour = current - torch.log(torch.tensor(RATIOS))
        batch["old_per_token_logps"] = behaviour
        theirs = trainer._compute_loss(model, batch).item()
        (row,) = pack_step(orchard_samples(batch, advantages, behaviour), batch_tokens=10_000)
        logits = model(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False).logits
        symmetric = packed_loss(token_logprobs(logits, row.targets), row, normalizer=row.loss_tokens, clip_eps=CLIP_LOW)

    assert symmetric.loss.item() != pytest.approx(theirs, rel=1e-3)
