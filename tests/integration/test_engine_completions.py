"""The local engine's legacy ``/v1/completions``: echo logprobs of given tokens, as vLLM answers them.

Real uvicorn on loopback, CPU, the tiny model built in the test. Checked:

- ``echo: true, logprobs: 0, max_tokens: 0`` on a token-id prompt returns each token's logprob given the tokens
  before it, equal (to 1e-5) to ``log_softmax`` of one direct forward pass, the first one ``null``;
- ``logprobs: N`` gives the top N alternatives plus the actual token, equal to the direct pass's ``topk``;
- a text prompt and a batch of prompts; generation with echo: a sample's logprobs equal a later scoring pass of the
  same tokens (a model scoring its own sample gives back the logprobs it sampled with);
- bad input answers OpenAI errors naming the field.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedModel
from transformers.utils import logging as hf_logging

from orchard.engines.local import LocalEngine
from orchard.engines.openai_api import create_engine_app
from orchard.engines.server import serve_in_thread
from orchard.engines.tiny import build_tiny_checkpoint

MODEL = "tiny-llama"
COMPLETIONS = "/v1/completions"
SEQUENCE = [5, 17, 200, 3, 88, 401, 12, 9, 300, 42, 7, 100]

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_checkpoint(MODEL, tmp_path_factory.mktemp("checkpoint"), seed=0)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> PreTrainedModel:
    hf_logging.disable_progress_bar()
    return AutoModelForCausalLM.from_pretrained(checkpoint).eval()


@pytest.fixture(scope="module")
def engine(checkpoint: Path) -> LocalEngine:
    return LocalEngine(checkpoint, model_name=MODEL, max_batch_size=8, max_queue=16, max_context=64, cpu_threads=1)


@pytest.fixture(scope="module")
def http(engine: LocalEngine) -> Iterator[httpx.Client]:
    with serve_in_thread(create_engine_app(engine)) as url, httpx.Client(base_url=url, timeout=60) as client:
        yield client


@torch.inference_mode()
def direct_logprobs(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """``log_softmax`` of one forward pass over ``ids``: row i is the distribution of token i + 1."""
    return torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)


def complete(http: httpx.Client, **body: object) -> dict[str, object]:
    response = http.post(COMPLETIONS, json={"model": MODEL} | body)
    assert response.status_code == 200, response.text
    return response.json()


def test_echo_logprobs_of_token_ids_equal_a_direct_forward_pass(http: httpx.Client, reference: PreTrainedModel) -> None:
    answer = complete(http, prompt=SEQUENCE, echo=True, logprobs=0, max_tokens=0, return_tokens_as_token_ids=True)
    [choice] = answer["choices"]
    logprobs = choice["logprobs"]
    expected = direct_logprobs(reference, SEQUENCE).gather(1, torch.tensor(SEQUENCE[1:]).unsqueeze(1)).squeeze(1)
    assert logprobs["tokens"] == [f"token_id:{t}" for t in SEQUENCE]
    assert logprobs["token_logprobs"][0] is None
    torch.testing.assert_close(torch.tensor(logprobs["token_logprobs"][1:]), expected, atol=1e-5, rtol=0)
    assert logprobs["top_logprobs"][0] is None
    assert [list(top) for top in logprobs["top_logprobs"][1:]] == [[f"token_id:{t}"] for t in SEQUENCE[1:]]
    assert choice["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": len(SEQUENCE), "completion_tokens": 0, "total_tokens": len(SEQUENCE)}


def test_top_logprobs_are_the_top_n_and_the_actual_token(http: httpx.Client, reference: PreTrainedModel) -> None:
    answer = complete(http, prompt=SEQUENCE, echo=True, logprobs=3, max_tokens=0, return_tokens_as_token_ids=True)
    tops = answer["choices"][0]["logprobs"]["top_logprobs"][1:]
    direct = direct_logprobs(reference, SEQUENCE)
    for row, (top, token) in enumerate(zip(tops, SEQUENCE[1:], strict=True)):
        values, indices = direct[row].topk(3)
        expected = {f"token_id:{i}": v for i, v in zip(indices.tolist(), values.tolist(), strict=True)}
        expected[f"token_id:{token}"] = direct[row, token].item()
        assert top == pytest.approx(expected, abs=1e-5)


def test_text_prompts_in_a_batch_are_tokenized_and_echoed(http: httpx.Client, engine: LocalEngine) -> None:
    prompts = ["Run the tests, read the failure.", "The quick brown fox"]
    answer = complete(http, prompt=prompts, echo=True, logprobs=0, max_tokens=0)
    assert [c["text"] for c in answer["choices"]] == prompts
    for choice, prompt in zip(answer["choices"], prompts, strict=True):
        ids = engine.tokenizer.encode(prompt)
        assert choice["logprobs"]["tokens"] == [engine.tokenizer.decode([t]) for t in ids]
        assert choice["logprobs"]["text_offset"][0] == 0
        assert len(choice["logprobs"]["token_logprobs"]) == len(ids)


def test_a_sample_scored_again_gives_back_its_own_logprobs(http: httpx.Client) -> None:
    sampled = complete(
        http, prompt=SEQUENCE, echo=True, logprobs=0, max_tokens=8, seed=3, return_tokens_as_token_ids=True
    )
    logprobs = sampled["choices"][0]["logprobs"]
    ids = [int(token.removeprefix("token_id:")) for token in logprobs["tokens"]]
    assert ids[: len(SEQUENCE)] == SEQUENCE
    assert sampled["usage"]["completion_tokens"] == len(ids) - len(SEQUENCE) > 0
    rescored = complete(http, prompt=ids, echo=True, logprobs=0, max_tokens=0)["choices"][0]["logprobs"]
    assert rescored["token_logprobs"] == pytest.approx(logprobs["token_logprobs"], abs=1e-4)


def test_generation_without_echo_returns_only_the_new_tokens(http: httpx.Client) -> None:
    # Token ids as keys: two top tokens may both decode to "\ufffd" (a partial UTF-8 byte), and text keys would merge.
    answer = complete(
        http, prompt=SEQUENCE, logprobs=2, max_tokens=4, temperature=0, n=2, return_tokens_as_token_ids=True
    )
    assert len(answer["choices"]) == 2
    first, second = (c["logprobs"] for c in answer["choices"])
    assert first == second  # greedy: both choices identical
    assert len(first["token_logprobs"]) == len(first["tokens"]) == answer["usage"]["completion_tokens"] // 2
    assert all(value is not None for value in first["token_logprobs"])
    assert all(2 <= len(top) <= 3 for top in first["top_logprobs"])


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": SEQUENCE, "stream": True}, 400, "stream"),
        ({"prompt": [1, 2, 10**6], "max_tokens": 0}, 400, "prompt"),
        ({"prompt": {"text": "x"}}, 400, "prompt"),
        ({"prompt": []}, 400, "prompt"),
        ({"prompt": SEQUENCE, "logprobs": 21}, 400, "logprobs"),
        ({"prompt": SEQUENCE * 6, "max_tokens": 0}, 400, "prompt"),
        ({"prompt": SEQUENCE, "max_tokens": 60}, 400, "max_tokens"),
        ({"prompt": SEQUENCE, "model": "other"}, 404, "model"),
    ],
)
def test_bad_requests_answer_openai_errors_naming_the_field(
    http: httpx.Client, body: dict[str, object], status: int, param: str
) -> None:
    response = http.post(COMPLETIONS, json={"model": MODEL} | body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
