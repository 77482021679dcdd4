"""Per-token losses of the policy trainer: credit-assignment SFT, clipped policy gradient, KL to a reference.

Every function works on per-position tensors of a micro-batch (``trainers.batching``) and ``packed_loss`` sums them,
so a step's loss is the same whichever way its samples were packed.

- **SFT (credit assignment)**: ``-w_t * log p(y_t)``, the weight ``w_t`` from the sample's ``advantages`` field
  (the credit-assignment consumer sets it: 1 on a productive fragment, less or 0 elsewhere).
- **RL**: token-level PPO surrogate ``-min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t)`` with the
  importance ratio ``r_t = exp(log p(y_t) - log mu(y_t))`` against the *recorded* behaviour logprob ``mu`` of the
  engine that sampled the token. Departure from textbook PPO: there is no separate "old policy" forward pass; the
  behaviour logprobs stand in for it, so the ratio also corrects for staleness and for engine/trainer numeric
  differences. A sample without behaviour logprobs (retokenized data) is treated as on-policy (``r_t = 1``,
  plain REINFORCE with the given advantages).
- **KL** to a frozen reference (the starting weights), with the non-negative ``k3`` estimator
  ``exp(q - p) - (q - p) - 1`` (Schulman's approximation; ``q`` the reference logprob), added per token.
- **Normalisation**: token-level. The summed per-token loss of a micro-batch is divided by the number of loss
  tokens of the whole optimizer step, so gradient accumulation gives exactly the gradient of the whole step, and
  long samples weigh in proportion to their tokens (as in DAPO), not per sample.
- **Staleness**: each token's loss is multiplied by its sample's staleness weight (``trainers.staleness``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from trainers.batching import PackedBatch


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log softmax(logits)[target]`` per position, computed in float32 (``[B, T, V]``, ``[B, T]`` -> ``[B, T]``)."""
    flat = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return -flat.view_as(targets)


def sft_token_loss(logprobs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted negative log-likelihood per token."""
    return -weights * logprobs


def policy_gradient_token_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_eps: float,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped surrogate per token, and a bool tensor of the tokens whose ratio was clipped (no gradient)."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = torch.exp(logprobs - behaviour_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
    return -torch.minimum(unclipped, clipped), clipped < unclipped


def kl_k3(logprobs: torch.Tensor, reference_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token ``k3`` estimate of KL(policy || reference) from sampled tokens; non-negative."""
    delta = reference_logprobs - logprobs
    return torch.exp(delta) - delta - 1.0


@dataclass
class LossOutput:
    """A micro-batch's loss (already divided by the step's loss tokens) and detached sums for the metrics."""

    loss: torch.Tensor
    loss_tokens: float
    rl_tokens: float
    clipped_tokens: float
    ratio_sum: float
    kl_sum: float


def packed_loss(
    logprobs: torch.Tensor,
    batch: PackedBatch,
    *,
    normalizer: float,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    kl_coef: float = 0.0,
    reference_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """The loss of one micro-batch: SFT or RL per token (by the sample's kind), plus KL, weighted and normalised."""
    behaviour = torch.where(batch.has_behaviour, batch.behaviour_logprobs, logprobs.detach())
    rl_loss, clipped = policy_gradient_token_loss(logprobs, behaviour, batch.advantages, clip_eps, clip_eps_high)
    per_token = torch.where(batch.is_rl, rl_loss, sft_token_loss(logprobs, batch.advantages))
    kl = torch.zeros_like(logprobs)
    if kl_coef > 0.0:
        if reference_logprobs is None:
            raise ValueError("kl_coef > 0 needs reference_logprobs")
        kl = kl_k3(logprobs, reference_logprobs)
        per_token = per_token + kl_coef * kl
    weight = batch.loss_mask * batch.token_weight
    loss = (per_token * weight).sum() / normalizer
    with torch.no_grad():
        rl_mask = batch.loss_mask * batch.is_rl
        ratio = torch.exp(logprobs - behaviour)
        return LossOutput(
            loss=loss,
            loss_tokens=float(batch.loss_mask.sum()),
            rl_tokens=float(rl_mask.sum()),
            clipped_tokens=float((clipped * rl_mask).sum()),
            ratio_sum=float((ratio * rl_mask).sum()),
            kl_sum=float((kl * batch.loss_mask).sum()),
        )
