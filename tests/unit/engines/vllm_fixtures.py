"""vLLM OpenAI-server answers as vLLM >= 0.10.2 writes them for ``return_token_ids``, ``logprobs: true,
top_logprobs: 0`` and ``return_tokens_as_token_ids`` (shapes from vLLM's ``ChatCompletionResponse`` and
``ChatCompletionStreamResponse``: ``prompt_token_ids`` top level, on the first chunk only when streamed; each choice's
``token_ids``, per chunk when streamed; chunks serialised with ``exclude_unset``). Shared by the vLLM unit tests.
"""

from __future__ import annotations

import copy
from typing import Any

PROMPT_IDS = [151644, 872, 198, 9707, 151645, 198, 151644, 77091, 198]
HELLO_IDS = [9707, 1052, 0, 151645]
HELLO_LOGPROBS = [-0.3125, -1.25, -0.0625, -0.001953125]
TOOL_IDS = [151657, 198, 4913, 606, 788, 330, 455, 151658, 151645]
TOOL_LOGPROBS = [-0.5, -0.25, -0.125, -0.0625, -0.03125, -0.015625, -0.0078125, -0.00390625, -0.001953125]
TOOL_CALL_ID = "chatcmpl-tool-5a0e8c4f2b6d4b0f9e1c7a3d2f6b8e10"


def _entries(ids: list[int], logprobs: list[float]) -> list[dict[str, Any]]:
    return [
        {"token": f"token_id:{t}", "logprob": lp, "bytes": [72], "top_logprobs": []}
        for t, lp in zip(ids, logprobs, strict=True)
    ]


def _response(choices: list[dict[str, Any]], completion_tokens: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-8b1f0c2e7d3a4f5b9c6e1d2a3b4c5d6e",
        "object": "chat.completion",
        "created": 1761000000,
        "model": "qwen-small",
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": {
            "prompt_tokens": len(PROMPT_IDS),
            "total_tokens": len(PROMPT_IDS) + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
        },
        "prompt_logprobs": None,
        "prompt_token_ids": list(PROMPT_IDS),
        "kv_transfer_params": None,
    }


def _message(content: str | None, tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": tool_calls or [],
        "reasoning_content": None,
    }


def hello_choice(index: int = 0, finish: str = "stop") -> dict[str, Any]:
    """A plain text choice: "Hello there!" then the end-of-turn token."""
    return {
        "index": index,
        "message": _message("Hello there!"),
        "logprobs": {"content": _entries(HELLO_IDS, HELLO_LOGPROBS)},
        "finish_reason": finish,
        "stop_reason": None,
        "token_ids": list(HELLO_IDS),
    }


def hello_response(n: int = 1) -> dict[str, Any]:
    """A non-streamed answer with ``n`` identical text choices."""
    return _response([hello_choice(i) for i in range(n)], n * len(HELLO_IDS))


def tool_response() -> dict[str, Any]:
    """A non-streamed answer whose text the hermes parser read as one tool call (content before it: none)."""
    call = {
        "id": TOOL_CALL_ID,
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    choice = {
        "index": 0,
        "message": _message(None, [call]),
        "logprobs": {"content": _entries(TOOL_IDS, TOOL_LOGPROBS)},
        "finish_reason": "tool_calls",
        "stop_reason": None,
        "token_ids": list(TOOL_IDS),
    }
    return _response([choice], len(TOOL_IDS))


def _chunk(choices: list[dict[str, Any]], **top: Any) -> dict[str, Any]:
    head = {"id": "chatcmpl-8b1f0c2e7d3a4f5b9c6e1d2a3b4c5d6e", "object": "chat.completion.chunk"}
    return head | {"created": 1761000000, "model": "qwen-small", "choices": choices} | top


def _delta(delta: dict[str, Any], ids: list[int], lps: list[float], finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": {"content": _entries(ids, lps)}}
    choice["finish_reason"] = finish
    if finish is not None:
        choice["stop_reason"] = None
    return choice | {"token_ids": ids}


def _usage_chunk(completion: int) -> dict[str, Any]:
    total = len(PROMPT_IDS) + completion
    usage = {"prompt_tokens": len(PROMPT_IDS), "total_tokens": total, "completion_tokens": completion}
    return _chunk([], usage=usage)


def _role_chunk() -> dict[str, Any]:
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
    return _chunk([role], prompt_token_ids=list(PROMPT_IDS))


def hello_stream() -> list[dict[str, Any]]:
    """The streamed chunks of ``hello_response()`` (before ``data: [DONE]``)."""
    ids, lps = HELLO_IDS, HELLO_LOGPROBS
    return [
        _role_chunk(),
        _chunk([_delta({"content": "Hello"}, ids[:1], lps[:1])]),
        _chunk([_delta({"content": " there"}, ids[1:2], lps[1:2])]),
        _chunk([_delta({"content": "!"}, ids[2:3], lps[2:3])]),
        _chunk([_delta({"content": ""}, ids[3:], lps[3:], "stop")]),
        _usage_chunk(len(ids)),
    ]


def tool_stream() -> list[dict[str, Any]]:
    """The streamed chunks of ``tool_response()``: the parser holds ``<tool_call>`` back (empty deltas that still
    carry token ids), then streams the call's name and its arguments in pieces."""
    ids, lps = TOOL_IDS, TOOL_LOGPROBS
    first = {"index": 0, "id": TOOL_CALL_ID, "type": "function", "function": {"name": "get_weather"}}
    return [
        _role_chunk(),
        _chunk([_delta({}, ids[:2], lps[:2])]),
        _chunk([_delta({"tool_calls": [first]}, ids[2:4], lps[2:4])]),
        _chunk([_delta({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}, ids[4:6], lps[4:6])]),
        _chunk([_delta({"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}, ids[6:7], lps[6:7])]),
        _chunk([_delta({}, ids[7:], lps[7:], "tool_calls")]),
        _usage_chunk(len(ids)),
    ]


def deep(value: Any) -> Any:
    """A deep copy (fixtures are mutated by some tests)."""
    return copy.deepcopy(value)
