"""Per-sequence sampling: greedy, temperature, top-p, private seeded streams, raw logprobs."""

from __future__ import annotations

import torch

from orchard.engines.sampling import SamplingParams, SequenceSampler, derive_seed, sample_batch


def _logits(rows: int = 3, vocab: int = 50, seed: int = 0) -> torch.Tensor:
    return torch.randn((rows, vocab), generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_picks_argmax_and_reports_raw_logprob() -> None:
    logits = _logits()
    samplers = [SequenceSampler(SamplingParams(max_tokens=4, temperature=0.0)) for _ in range(3)]
    tokens, logprobs = sample_batch(logits, samplers)
    assert tokens == logits.argmax(-1).tolist()
    expected = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(torch.tensor(logprobs), expected)


def test_logprob_is_raw_not_temperature_scaled() -> None:
    logits = _logits(rows=1)
    sampler = SequenceSampler(SamplingParams(max_tokens=4, temperature=0.5, seed=1))
    [token], [logprob] = sample_batch(logits, [sampler])
    assert logprob == torch.log_softmax(logits[0], -1)[token].item()
    assert abs(logprob - torch.log_softmax(logits[0] / 0.5, -1)[token].item()) > 1e-3


def test_seeded_streams_do_not_depend_on_the_batch() -> None:
    logits = _logits(rows=4)
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=11)
    alone = [sample_batch(logits[i : i + 1], [SequenceSampler(params, i)])[0][0] for i in range(4)]
    batched, _ = sample_batch(logits, [SequenceSampler(params, i) for i in range(4)])
    assert batched == alone
    draws = [sample_batch(logits[:1].repeat(64, 1), [SequenceSampler(params, i) for i in range(64)])[0]]
    assert len(set(draws[0])) > 1  # the choices of one request differ


def test_top_p_keeps_only_the_nucleus() -> None:
    logits = torch.tensor([[5.0, 4.0, 0.0, -1.0, -2.0]])
    params = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.5, seed=0)
    tokens = {sample_batch(logits, [SequenceSampler(params, i)])[0][0] for i in range(200)}
    assert tokens == {0}
    wider = SamplingParams(max_tokens=1, temperature=1.0, top_p=0.9, seed=0)
    assert {sample_batch(logits, [SequenceSampler(wider, i)])[0][0] for i in range(200)} == {0, 1}


def test_derive_seed_is_stable_and_spreads() -> None:
    assert derive_seed(7, 0) == derive_seed(7, 0)
    assert len({derive_seed(s, i) for s in range(10) for i in range(10)}) == 100
    assert all(0 <= derive_seed(s, 3) < 2**63 for s in (0, 1, 2**62))
