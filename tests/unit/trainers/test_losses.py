"""Losses of the policy trainer: the clipped policy gradient against a hand-computed gradient, SFT on a tiny model."""

from __future__ import annotations

import torch

from trainers.backends.torch_backend import TorchBackend
from trainers.batching import PackedBatch, pack_step, sample_from_record
from trainers.config import PolicyTrainerConfig, TinyModelSource
from trainers.losses import kl_k3, packed_loss, policy_gradient_token_loss, token_logprobs
from trainers.model import load_policy_model
from trainers.synthetic import synthetic_stream

TINY_VOCAB = 420


def _row(**fields: torch.Tensor) -> PackedBatch:
    n = fields["targets"].shape[1]
    ones = torch.ones(1, n)
    defaults = {
        "input_ids": torch.zeros(1, n, dtype=torch.long),
        "position_ids": torch.arange(n).unsqueeze(0),
        "loss_mask": ones,
        "advantages": ones,
        "behaviour_logprobs": torch.zeros(1, n),
        "has_behaviour": ones.bool(),
        "is_rl": ones.bool(),
        "token_weight": ones,
    }
    return PackedBatch(**(defaults | fields), sample_ids=["s"], num_tokens=n, padded_tokens=0)


def test_rl_gradient_matches_the_hand_computed_reference() -> None:
    """A 1-layer logits model (logits = x W): autograd of the clipped surrogate + KL equals the hand formula.

    Per loss token t: dL/dlogp_t = w_t / N * (-r_t A_t if the ratio is not clipped else 0) + kl_coef w_t / N *
    (1 - exp(ref_t - logp_t)); dlogp_t/dlogits_t = onehot(y_t) - softmax_t; dL/dW = x^T dL/dlogits.
    """
    torch.manual_seed(0)
    n, d, v = 8, 5, 7
    x = torch.randn(n, d, dtype=torch.float64)
    weight = torch.randn(d, v, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, v, (1, n))
    logp0 = torch.log_softmax(x @ weight.detach(), -1)[torch.arange(n), targets[0]]
    # behaviour logprobs chosen so the ratios are 0.5 (below 1 - eps), 1.0, 1.5 (above 1 + eps), 1.1 (inside)
    ratios = torch.tensor([0.5, 1.0, 1.5, 1.1, 0.5, 1.5, 0.9, 1.0], dtype=torch.float64)
    behaviour = logp0 - torch.log(ratios)
    advantages = torch.tensor([1.0, -1.0, 1.0, 2.0, -1.0, -0.5, 0.7, 1.0], dtype=torch.float64)
    mask = torch.tensor([1, 1, 1, 1, 1, 1, 1, 0], dtype=torch.float64)
    stale_weight = torch.tensor([1, 1, 1, 0.5, 1, 1, 1, 1], dtype=torch.float64)
    reference = logp0 + 0.3
    kl_coef, eps, normalizer = 0.1, 0.2, 7.0
    row = _row(
        targets=targets,
        loss_mask=mask.unsqueeze(0),
        advantages=advantages.unsqueeze(0),
        behaviour_logprobs=behaviour.unsqueeze(0),
        token_weight=stale_weight.unsqueeze(0),
    )

    logits = (x @ weight).unsqueeze(0)
    out = packed_loss(
        token_logprobs(logits, targets).double(),
        row,
        normalizer=normalizer,
        clip_eps=eps,
        kl_coef=kl_coef,
        reference_logprobs=reference.unsqueeze(0),
    )
    out.loss.backward()

    probs = torch.softmax(x @ weight.detach(), -1)
    onehot = torch.nn.functional.one_hot(targets[0], v).double()
    clipped = ((ratios > 1 + eps) & (advantages > 0)) | ((ratios < 1 - eps) & (advantages < 0))
    d_logp = torch.where(clipped, torch.zeros_like(ratios), -ratios * advantages)
    d_logp = d_logp + kl_coef * (1 - torch.exp(reference - logp0))
    d_logp = d_logp * mask * stale_weight / normalizer
    expected = x.T @ (d_logp.unsqueeze(1) * (onehot - probs))
    torch.testing.assert_close(weight.grad, expected)
    assert out.clipped_tokens == float((clipped.double() * mask).sum())


def test_clipping_applies_per_sign_of_the_advantage() -> None:
    logp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    loss, clipped = policy_gradient_token_loss(logp, torch.zeros(4), torch.tensor([1.0, -1.0, 1.0, -1.0]), 0.2)
    torch.testing.assert_close(loss, torch.tensor([-1.2, 1.5, -0.5, 0.8]))
    assert clipped.tolist() == [True, False, False, True]


def test_kl_estimate_is_zero_at_the_reference_and_positive_elsewhere() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5])
    assert kl_k3(logp, logp).tolist() == [0.0, 0.0, 0.0]
    assert bool((kl_k3(logp, logp + torch.tensor([0.3, -0.4, 1.0])) > 0).all())


def test_sample_without_behaviour_logprobs_gets_the_plain_policy_gradient() -> None:
    logits = torch.randn(1, 4, 6, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([[1, 2, 3, 4]])
    advantages = torch.tensor([[1.0, -2.0, 0.5, 1.0]], dtype=torch.float64)
    row = _row(targets=targets, advantages=advantages, has_behaviour=torch.zeros(1, 4, dtype=torch.bool))
    logp = token_logprobs(logits, targets).double()
    packed_loss(logp, row, normalizer=4.0).loss.backward()
    grad_auto = logits.grad.clone()
    logits.grad = None
    (-(advantages * token_logprobs(logits, targets)).sum() / 4.0).backward()
    torch.testing.assert_close(grad_auto, logits.grad)


def test_sft_loss_on_a_fixed_batch_decreases() -> None:
    torch.manual_seed(0)
    config = PolicyTrainerConfig(model=TinyModelSource(name="tiny-llama-micro"), lr=3e-3, grad_clip=1.0)
    backend = TorchBackend(load_policy_model(config.model), config, torch.device("cpu"))
    records = synthetic_stream(6, kinds=("SFT",), vocab_size=TINY_VOCAB, lengths=(32, 48, 64))
    samples = [sample_from_record(r) for r in records]
    batches = pack_step(samples, batch_tokens=128)
    normalizer = float(sum(s.num_loss_tokens for s in samples))
    losses = []
    for _ in range(8):
        total = 0.0
        for batch in batches:
            logp = token_logprobs(backend.forward(batch.input_ids, batch.position_ids), batch.targets)
            out = packed_loss(logp, batch, normalizer=normalizer)
            backend.backward(out.loss)
            total += float(out.loss.detach())
        backend.step()
        losses.append(total)
    assert len(batches) > 1  # the step spans several micro-batches (gradient accumulation)
    assert all(later < earlier for earlier, later in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < 0.8 * losses[0], losses
