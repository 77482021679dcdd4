"""A real harness against a real model: opencode through the recording proxy and the Env to the local engine serving
``tiny-llama-32k`` (random weights, CPU), each component its own process (``benchmarks/harness_local_engine.py``,
loaded by path: ``benchmarks/`` is not a package).

opencode's first prompt (~16k tokens of the tiny tokenizer) fits the 32,768-token context; the call is answered,
recorded token-exactly (the prompt is the engine's rendering of the recorded messages and tools, the logprobs its
weights' over the recorded tokens) and the episode is graded: it fails the task, as random weights do, with an
outcome on the bus. Claude Code's episode (~31.5k-token prompts after ``CLAUDE_CODE_TRIM``, four calls: its
output-token-limit recovery resends the prompt three times) takes 2-4 minutes of prefill on 2 cores and runs in the
benchmark only.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = [pytest.mark.harness, pytest.mark.slow]
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "harness_local_engine.py"


def load_benchmark() -> ModuleType:
    """``benchmarks/harness_local_engine.py`` as a module."""
    spec = importlib.util.spec_from_file_location("harness_local_engine", BENCHMARK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    return load_benchmark()


@pytest.fixture
def stack(bench: ModuleType, tmp_path: Path) -> Iterator[Any]:
    with bench.running(tmp_path, "tiny-llama-32k", max_tokens=16) as stack:
        yield stack


def test_an_opencode_episode_against_the_local_engine_is_answered_recorded_token_exactly_and_graded(
    bench: ModuleType, stack: Any
) -> None:
    result = bench.run_episode(stack, "opencode", max_tokens=16, timeout_s=240)

    calls = result.calls_received
    assert 1 <= calls <= 3, result  # a random reply without a tool call ends the run
    assert (result.calls_recorded, result.records, result.num_model_calls) == (calls, calls, calls), result
    assert 12_000 < result.first_prompt_tokens < 24_000, result  # past tiny-llama-8k's context, within this one
    assert all(1 <= tokens <= 16 for tokens in result.completion_tokens), result
    assert (result.harness_api, result.prompts_as_rendered) == (["CHAT"], True), result
    assert result.max_logprob_diff < 1e-3, result
    assert (result.status, result.reward, result.error, result.harness_exit_code) == ("FAILED", 0.0, None, 0), result
