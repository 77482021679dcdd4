"""Dense-reward plug-ins against real local engines (uvicorn on loopback, CPU, tiny models built in the test).

- distillation: student steps are sampled from the seed-0 engine (their logprobs are the engine's own); with the
  same engine as teacher the per-token reverse KL is ~0; with the seed-1 engine as teacher each per-token value is
  ``student logprob - log_softmax`` of a direct forward pass of the seed-1 model; both request shapes
  (``max_tokens`` 0, and 1 as vLLM needs) agree; ``emit="tokens"`` gives one span per token;
- failures name the episode and call: an unreachable teacher, a teacher that scores another number of tokens;
- the engine-backed process reward model returns a score per step, equal to what the verdict logprobs of a direct
  forward pass give;
- run by the reward consumer, every record a dense plug-in publishes for an episode says how many there are.
"""

from __future__ import annotations

import math
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from fastapi import FastAPI
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from consumers.dense.distillation import OnPolicyDistillation
from consumers.dense.exceptions import EngineUnreachableError, TokenMismatchError
from consumers.dense.process_reward import EngineProcessReward
from consumers.reward_consumer import RewardConsumer
from consumers.rewards import Score
from orchard.engines.local import LocalEngine
from orchard.engines.openai_api import create_engine_app
from orchard.engines.server import serve_in_thread
from orchard.engines.tiny import build_tiny_checkpoint
from orchard.engines.token_trace import trace_of
from orchard.trajectory import Step, Trajectory

MODEL = "tiny-llama"
CONVERSATIONS = [
    [{"role": "user", "content": "Run the tests, read the failure."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Fix the bug, and run the tests again."},
    ],
]

pytestmark = pytest.mark.slow


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    root = tmp_path_factory.mktemp("checkpoints")
    return {seed: build_tiny_checkpoint(MODEL, root / f"seed{seed}", seed=seed) for seed in (0, 1)}


@pytest.fixture(scope="module")
def urls(checkpoints: dict[int, Path]) -> Iterator[dict[int, str]]:
    engines = {
        seed: LocalEngine(path, model_name=MODEL, max_batch_size=8, max_queue=32, max_context=1024, cpu_threads=1)
        for seed, path in checkpoints.items()
    }
    with serve_in_thread(create_engine_app(engines[0])) as student, serve_in_thread(create_engine_app(engines[1])) as t:
        yield {0: student, 1: t}


@pytest.fixture(scope="module")
def tokenizer(checkpoints: dict[int, Path]) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(checkpoints[0])


@pytest.fixture(scope="module")
def reference(checkpoints: dict[int, Path]) -> dict[int, PreTrainedModel]:
    hf_logging.disable_progress_bar()
    return {seed: AutoModelForCausalLM.from_pretrained(path).eval() for seed, path in checkpoints.items()}


@pytest.fixture(scope="module")
def episode(urls: dict[int, str]) -> Trajectory:
    """Two steps sampled from the seed-0 engine: token ids and logprobs exactly as the engine reported them."""
    steps = []
    with httpx.Client(base_url=urls[0], timeout=60) as client:
        for index, messages in enumerate(CONVERSATIONS):
            body = {"model": MODEL, "messages": messages, "max_tokens": 12, "seed": index, "temperature": 1.0}
            answer = client.post("/v1/chat/completions", json=body).json()
            trace = trace_of(answer)
            assert trace is not None
            steps.append(
                Step(
                    call_index=index,
                    conversation_id=index,
                    policy_version=0,
                    prompt_token_ids=np.array(trace.prompt_token_ids, dtype=np.int32),
                    completion_token_ids=np.array(trace.completion_token_ids, dtype=np.int32),
                    completion_logprobs=np.array(trace.completion_logprobs, dtype=np.float32),
                    request_messages=messages,
                    response_text=answer["choices"][0]["message"]["content"] or "",
                    response_tool_calls=[],
                    finish_reason=answer["choices"][0]["finish_reason"],
                )
            )
    return Trajectory(run_id="run", episode_id="ep-7", task_id="task", group_id="g", steps=tuple(steps))


@torch.inference_mode()
def direct_completion_logprobs(model: PreTrainedModel, step: Step) -> np.ndarray:
    """``log_softmax`` of one forward pass over prompt + completion, at each completion token."""
    ids = torch.tensor(step.sequence.astype(np.int64)).unsqueeze(0)
    logprobs = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    targets = ids[0, 1:].unsqueeze(1)
    return logprobs.gather(1, targets).squeeze(1).numpy()[len(step.prompt_token_ids) - 1 :]


def distillation(url: str, **kw: Any) -> OnPolicyDistillation:
    return OnPolicyDistillation(teacher_url=url, teacher_model=MODEL, **kw)


# ---------------------------------------------------------------------------------------------------- distillation
@pytest.mark.parametrize("echo_max_tokens", [0, 1])
def test_the_student_as_its_own_teacher_gives_zero_reverse_kl(
    urls: dict[int, str], episode: Trajectory, echo_max_tokens: int
) -> None:
    plugin = distillation(urls[0], echo_max_tokens=echo_max_tokens)
    scores = plugin.score_episode(episode)
    assert [s.call_index for s in scores] == [0, 1]
    for score, step in zip(scores, episode.steps, strict=True):
        per_token = score.details["per_token"]
        assert len(per_token) == len(step.completion_token_ids)
        np.testing.assert_allclose(per_token, 0.0, atol=1e-4)
        assert score.score == pytest.approx(-float(np.mean(per_token)))
        assert score.details["teacher_model"] == MODEL


@pytest.mark.parametrize("echo_max_tokens", [0, 1])
def test_per_token_values_are_student_minus_a_direct_teacher_forward_pass(
    urls: dict[int, str], episode: Trajectory, reference: dict[int, PreTrainedModel], echo_max_tokens: int
) -> None:
    plugin = distillation(urls[1], echo_max_tokens=echo_max_tokens, concurrency=2)
    scores = plugin.score_episode(episode)
    for score, step in zip(scores, episode.steps, strict=True):
        expected = step.completion_logprobs.astype(np.float64) - direct_completion_logprobs(reference[1], step)
        np.testing.assert_allclose(score.details["per_token"], expected, atol=1e-5, rtol=0)
        assert np.abs(expected).max() > 0.1  # another model: a real signal, not a vacuous zero


def test_token_spans_carry_one_score_per_completion_token(urls: dict[int, str], episode: Trajectory) -> None:
    per_step = distillation(urls[1]).score_episode(episode)
    per_token = distillation(urls[1], emit="tokens").score_episode(episode)
    expected = [
        Score(score.call_index, -kl, token_start=t, token_end=t + 1)
        for score in per_step
        for t, kl in enumerate(score.details["per_token"])
    ]
    assert per_token == expected


def test_every_record_a_dense_plugin_publishes_for_an_episode_carries_their_count(
    urls: dict[int, str], episode: Trajectory
) -> None:
    plugins = [
        distillation(urls[1], emit="tokens"),
        distillation(urls[1]),
        EngineProcessReward(judge_url=urls[1], judge_model=MODEL, echo_max_tokens=1),
    ]
    tokens = sum(len(step.completion_token_ids) for step in episode.steps)
    counts = []
    for plugin in plugins:
        records = RewardConsumer(plugin).episode_records(episode, 0)
        counts.append({(len(records), record["episode_score_count"]) for record in records})
        plugin.close()
    assert counts == [{(tokens, tokens)}, {(2, 2)}, {(2, 2)}]


def test_an_unreachable_teacher_raises_naming_the_episode_and_call(episode: Trajectory) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        plugin = distillation(f"http://127.0.0.1:{port}/v1", max_retries=0, concurrency=1)
        with pytest.raises(EngineUnreachableError, match=r"^episode ep-7 call 0: the engine at http://127\.0\.0\.1"):
            plugin.score_episode(episode)


def test_a_teacher_scoring_another_number_of_tokens_raises(episode: Trajectory) -> None:
    app = FastAPI()

    @app.post("/v1/completions")
    async def short(body: dict[str, Any]) -> dict[str, Any]:
        logprobs = {"tokens": ["a", "b"], "token_logprobs": [None, -1.0], "top_logprobs": [None, {}]}
        return {"choices": [{"index": 0, "text": "ab", "logprobs": logprobs, "finish_reason": "length"}]}

    with serve_in_thread(app) as url:
        plugin = distillation(url, echo_max_tokens=0, concurrency=1)
        step = episode.steps[1]
        with pytest.raises(TokenMismatchError, match=rf"^episode ep-7 call 1: sent {len(step.sequence)} tokens"):
            plugin.score_step(step, episode)


# ---------------------------------------------------------------------------------------------------- judge
@torch.inference_mode()
def sequence_logprob(model: PreTrainedModel, ids: list[int], start: int) -> float:
    """Sum of the logprobs of ``ids[start:]`` given the tokens before, from one direct forward pass."""
    logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    return float(logprobs.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)[start - 1 :].sum())


def test_the_engine_judge_scores_every_step_from_its_verdict_logprobs(
    urls: dict[int, str],
    episode: Trajectory,
    reference: dict[int, PreTrainedModel],
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    plugin = EngineProcessReward(judge_url=urls[1], judge_model=MODEL, max_context_chars=300, echo_max_tokens=1)
    scores = plugin.score_episode(episode)
    assert [s.call_index for s in scores] == [0, 1]
    for score, step in zip(scores, episode.steps, strict=True):
        prompt = plugin.judge_prompt(step)
        assert step.response_text in prompt and "Fix the bug" in plugin.judge_prompt(episode.steps[1])
        good = tokenizer.encode(prompt + " good")
        bad = tokenizer.encode(prompt + " bad")
        shared = next(i for i, (a, b) in enumerate(zip(good, bad, strict=False)) if a != b)
        margin = sequence_logprob(reference[1], good, shared) - sequence_logprob(reference[1], bad, shared)
        p_good = 1 / (1 + math.exp(-margin))
        assert score.details["p_good"] == pytest.approx(p_good, abs=1e-5)
        assert score.score == pytest.approx(2 * p_good - 1, abs=1e-5)
        assert -1.0 < score.score < 1.0
