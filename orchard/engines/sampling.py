"""Per-sequence sampling for a batch: temperature, top-p and a private random stream per sequence.

**Which logprob the engine reports.** For every sampled token the engine reports the *raw* model logprob:
``log_softmax(logits)[token]`` of the unmodified logits, in float32, *before* temperature scaling and top-p
truncation. It is the quantity a trainer recomputes with a plain forward pass (the policy's own distribution at
temperature 1), so the importance ratio between the serving and the training weights needs no knowledge of the
request's sampling parameters. It is *not* the probability of the distribution the token was actually drawn from
when ``temperature != 1`` or ``top_p < 1``; a trainer that wants that must apply the request's temperature and
top-p itself. This matches vLLM's ``logprobs_mode="raw_logprobs"`` (its default), so both engines report the same
thing.

Randomness: each sequence draws one uniform number per step from its own ``torch.Generator`` (seeded from the
request's ``seed`` and the choice index, or from OS entropy), so a sequence's tokens do not depend on which other
requests share its batch. ``temperature == 0`` is greedy (argmax; the generator is not used).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import torch

_MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How one request samples; validated by the API layer before it reaches the scheduler."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None


def derive_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request seeded with ``seed`` (splitmix64 of both, so choices differ).

    >>> derive_seed(7, 0) == derive_seed(7, 0), derive_seed(7, 0) == derive_seed(7, 1)
    (True, False)
    """
    z = (seed * 0x9E3779B97F4A7C15 + index + 1) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


@dataclass(slots=True)
class SequenceSampler:
    """The sampling state of one sequence: its parameters and its private random stream."""

    params: SamplingParams
    index: int = 0
    generator: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        seed = secrets.randbits(63) if self.params.seed is None else derive_seed(self.params.seed, self.index)
        self.generator = torch.Generator().manual_seed(seed)

    def uniform(self) -> float:
        """The next number of this sequence's stream, in [0, 1)."""
        return float(torch.rand((), generator=self.generator))


def sample_batch(logits: torch.Tensor, samplers: list[SequenceSampler]) -> tuple[list[int], list[float]]:
    """Sample one token per row of ``logits`` (B, V) and return the tokens and their raw logprobs."""
    logits = logits.float()
    raw_logprobs = torch.log_softmax(logits, dim=-1)
    tokens = torch.argmax(logits, dim=-1)
    sampled_rows = [i for i, s in enumerate(samplers) if s.params.temperature > 0]
    if sampled_rows:
        device = logits.device
        rows = torch.tensor(sampled_rows, device=device)
        temperature = torch.tensor([samplers[i].params.temperature for i in sampled_rows], device=device)
        top_p = torch.tensor([samplers[i].params.top_p for i in sampled_rows], device=device)
        uniforms = torch.tensor([samplers[i].uniform() for i in sampled_rows], device=device)
        tokens[rows] = _sample_top_p(logits[rows] / temperature.unsqueeze(1), top_p.unsqueeze(1), uniforms.unsqueeze(1))
    chosen = raw_logprobs.gather(1, tokens.unsqueeze(1)).squeeze(1)
    return tokens.tolist(), chosen.tolist()


def _sample_top_p(scaled: torch.Tensor, top_p: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF sampling from the smallest set of most likely tokens whose mass reaches ``top_p``, per row."""
    probs = torch.softmax(scaled, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    cumulative = torch.cumsum(sorted_probs, dim=-1)
    keep = (cumulative - sorted_probs) < top_p  # the first token is always kept
    kept = sorted_probs * keep
    cdf = torch.cumsum(kept, dim=-1)
    targets = uniforms * cdf[:, -1:]
    picked = torch.searchsorted(cdf, targets, right=True).clamp(max=kept.shape[-1] - 1)
    return order.gather(1, picked).squeeze(1)
