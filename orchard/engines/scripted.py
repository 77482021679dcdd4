"""The scripted model backend: an OpenAI-compatible server that replays a fixed plan, with token ids and logprobs.

Real harnesses (Codex CLI, mini-swe-agent, the built-in agent) are driven deterministically by pointing them at this
server: each request is answered with the next step of a ``ScriptedPlan`` (a text reply, or tool calls, with a finish
reason); once the plan is exhausted every request is answered with ``plan.final_text``. It serves
``/v1/chat/completions`` and ``/v1/responses`` (both streamed and not), ``/v1/tokenize`` (the prompt token ids of a
chat body, as the local engine answers it; the plan does not advance) and ``/v1/models``, and every response carries
the token trace of ``orchard.engines.token_trace``, exactly as a real engine's would.
``ScriptedEngine`` is the ``scripted`` backend of the engine interface (``orchard.engines.base.Engine``);
``orchard engine scripted PLAN`` serves it through ``orchard.engines.server.serve_engine``.

The plan's cursor is kept per *plan key*: the request's ``user`` field, else the ``X-Orchard-Plan-Key`` header, else
the ``X-Orchard-Episode-Id`` header the recording proxy adds, else one global cursor. So concurrent episodes behind
one proxy each replay the plan from its start.

The "tokenizer" is deterministic and needs no model: a prompt is a canonical JSON rendering of the tools and of each
message (or Responses input item), one line each; a completion is the rendering of the reply message (or output
items). Each line's UTF-8 bytes are cut into tokens of three bytes (the last one shorter), about as dense as a real
BPE on code, and token id = ``TOKEN_OFFSET + ((length - 1) << 24 | the bytes as a big-endian number)``. Lines are
tokenized separately, so a harness that appends the reply and the tool results to its history sends a prompt that
extends the previous prompt + completion token for token, as a real chat template does, which is what prefix-delta
encoding and conversation lineage rely on. The logprob of completion token ``i`` is ``-0.01 * (i % 7)``.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import yaml
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from pydantic_core import from_json, to_json

from orchard.engines.openai_common import model_list
from orchard.engines.token_trace import TokenTrace
from orchard.logging import get_logger

log = get_logger("engines.scripted")

TOKEN_OFFSET = 16
"""Ids below it are never produced (room for special tokens)."""
TOKEN_BYTES = 3
"""UTF-8 bytes per token (ids stay below 2**26, well inside int32)."""
PLAN_KEY_HEADER = "x-orchard-plan-key"
EPISODE_HEADER = "x-orchard-episode-id"  # set by the recording proxy on every forwarded request
STREAM_PIECE_CHARS = 8
"""Streamed text and tool arguments arrive in pieces of this many characters."""

Flavour = Literal["chat", "responses"]


class ScriptedToolCall(BaseModel):
    """One tool call of a step: the function's name and its JSON arguments (an object, or a JSON string as is)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Function name.")
    arguments: dict[str, Any] | str = Field(default_factory=dict, description="Arguments object or JSON string.")

    def arguments_json(self) -> str:
        """The arguments as the JSON string the API carries."""
        return self.arguments if isinstance(self.arguments, str) else json.dumps(self.arguments)


class ScriptedStep(BaseModel):
    """One reply: text, tool calls (or both), and why generation stopped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(default="", description="Text content of the reply.")
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list, description="Tool calls of the reply.")
    finish_reason: str | None = Field(default=None, description="Default: 'tool_calls' with tool calls, else 'stop'.")
    delay_s: float = Field(default=0.0, ge=0, le=3600, description="Wait this long before answering (timeout tests).")

    @property
    def finish(self) -> str:
        """The finish reason reported for this step."""
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


class ScriptedPlan(BaseModel):
    """The replies to give, in order; ``final_text`` once they are used up."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    steps: list[ScriptedStep] = Field(default_factory=list, description="Replies, in order.")
    final_text: str = Field(default="done", description="Reply to every request after the last step.")
    model: str = Field(default="orchard-scripted", min_length=1, description="Model id listed by /v1/models.")

    @classmethod
    def from_file(cls, path: Path | str) -> ScriptedPlan:
        """Load a plan from YAML or JSON: a mapping of these fields, or just the list of steps."""
        data = yaml.safe_load(Path(path).read_text())
        return cls.model_validate({"steps": data} if isinstance(data, list) else data or {})

    def step(self, cursor: int) -> ScriptedStep:
        """The step answering request number ``cursor`` of a plan key."""
        return self.steps[cursor] if cursor < len(self.steps) else ScriptedStep(text=self.final_text)


# ---------------------------------------------------------------------------------------------------- tokenizer
def encode_text(text: str) -> list[int]:
    """Token ids of ``text``: its UTF-8 bytes in tokens of ``TOKEN_BYTES`` (the last one shorter)."""
    data = text.encode()
    whole = len(data) - len(data) % TOKEN_BYTES
    chunks = np.frombuffer(data[:whole], dtype=np.uint8).reshape(-1, TOKEN_BYTES).astype(np.int64)
    ids = (TOKEN_BYTES - 1) << 24 | chunks[:, 0] << 16 | chunks[:, 1] << 8 | chunks[:, 2]
    tail = data[whole:]
    return [
        *(ids + TOKEN_OFFSET).tolist(),
        *([TOKEN_OFFSET + ((len(tail) - 1) << 24 | int.from_bytes(tail))] if tail else []),
    ]


def decode_ids(ids: Sequence[int]) -> str:
    """Text of token ids made by ``encode_text``."""
    out = bytearray()
    for token in ids:
        value = int(token) - TOKEN_OFFSET
        out += (value & 0xFFFFFF).to_bytes((value >> 24) + 1)
    return out.decode()


def content_text(content: Any) -> str:
    """Plain text of a message content: a string, None, or a list of parts carrying ``text``."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return json.dumps(content, sort_keys=True)


def normalize_item(item: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical form of a chat message or Responses item, so an echoed reply renders like the original."""
    kind = item.get("type", "message")
    if kind == "message":
        out: dict[str, Any] = {"role": item.get("role", "user"), "content": content_text(item.get("content"))}
        if item.get("tool_calls"):
            out["tool_calls"] = [_normalize_tool_call(call) for call in item["tool_calls"]]
        if "tool_call_id" in item:
            out["tool_call_id"] = item["tool_call_id"]
        return out
    if kind == "function_call":
        return {key: item.get(key) for key in ("type", "call_id", "name", "arguments")}
    if kind == "function_call_output":
        return {"type": kind, "call_id": item.get("call_id"), "output": content_text(item.get("output"))}
    return {key: value for key, value in item.items() if key not in ("id", "status")}


def _normalize_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function") or {}
    return {"id": call.get("id"), "name": function.get("name"), "arguments": function.get("arguments")}


def render(items: Sequence[Mapping[str, Any]], tools: Sequence[Any] = ()) -> list[int]:
    """Token ids of a tools header (when there are tools) followed by one canonical line per item."""
    lines = [_line({"tools": list(tools)})] if tools else []
    lines += [_line(normalize_item(item)) for item in items]
    return [token for line in lines for token in encode_text(line)]


def _line(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"


def scripted_logprobs(count: int) -> list[float]:
    """The deterministic logprob of each of ``count`` completion tokens."""
    return [-0.01 * (i % 7) for i in range(count)]


# ---------------------------------------------------------------------------------------------------- requests
class TraceTokenizer(Protocol):
    """A policy's tokenizer for the scripted backend: token ids as the policy's engine would report them."""

    def chat_trace_ids(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any], reply: Mapping[str, Any]
    ) -> tuple[list[int], list[int]]:
        """Prompt ids of ``messages`` (with ``tools``) and completion ids of the assistant ``reply``."""


class ScriptedRequestError(ValueError):
    """A request the scripted backend cannot answer (answered with a 400 OpenAI error)."""


@dataclass(frozen=True, slots=True)
class _Turn:
    """One request being answered: what was asked and the step answering it."""

    flavour: Flavour
    body: dict[str, Any]
    items: list[dict[str, Any]]
    tools: list[Any]
    step: ScriptedStep
    index: int  # position in the plan key's sequence; makes tool call ids deterministic
    policy_version: int
    tokenizer: TraceTokenizer | None = None

    @property
    def model(self) -> str:
        return str(self.body["model"])

    def call_id(self, j: int) -> str:
        return f"call_{self.index}_{j}"

    def trace(self, completion_ids: list[int]) -> TokenTrace:
        return TokenTrace(
            prompt_token_ids=render(self.items, self.tools),
            completion_token_ids=completion_ids,
            completion_logprobs=scripted_logprobs(len(completion_ids)),
            policy_version=self.policy_version,
        )


def _request_items(flavour: Flavour, body: Mapping[str, Any]) -> list[dict[str, Any]]:
    if flavour == "chat":
        items = body.get("messages")
        if not isinstance(items, list) or not items:
            raise ScriptedRequestError("'messages' must be a non-empty array")
    else:
        raw = body.get("input")
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
        if not isinstance(items, list):
            raise ScriptedRequestError("'input' must be a string or an array of items")
        if body.get("instructions"):
            items = [{"role": "system", "content": str(body["instructions"])}, *items]
    if not all(isinstance(item, Mapping) for item in items):
        raise ScriptedRequestError("every message or input item must be an object")
    return [dict(item) for item in items]


def _parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = from_json(raw)
    except ValueError as exc:
        raise ScriptedRequestError(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict) or not isinstance(body.get("model"), str):
        raise ScriptedRequestError("request body must be a JSON object with a string 'model'")
    return body


def _plan_key(request: Request, body: Mapping[str, Any]) -> str:
    user = body.get("user")
    if isinstance(user, str) and user:
        return f"user:{user}"
    for header in (PLAN_KEY_HEADER, EPISODE_HEADER):
        if request.headers.get(header):
            return f"{header}:{request.headers[header]}"
    return ""


# ---------------------------------------------------------------------------------------------------- chat
def _chat_message(turn: _Turn) -> dict[str, Any]:
    step = turn.step
    message: dict[str, Any] = {"role": "assistant", "content": step.text if step.text or not step.tool_calls else None}
    if step.tool_calls:
        message["tool_calls"] = [
            {"id": turn.call_id(j), "type": "function", "function": {"name": c.name, "arguments": c.arguments_json()}}
            for j, c in enumerate(step.tool_calls)
        ]
    return message


def _chat_trace(turn: _Turn) -> TokenTrace:
    if turn.tokenizer is None:
        return turn.trace(render([_chat_message(turn)]))
    prompt, completion = turn.tokenizer.chat_trace_ids(turn.items, turn.tools, _chat_message(turn))
    # A scripted expert is deterministic: each of its tokens had probability 1.
    return TokenTrace(
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[0.0] * len(completion),
        policy_version=turn.policy_version,
    )


def chat_completion(turn: _Turn) -> dict[str, Any]:
    """The non-streamed chat completion object (``n`` identical choices, each with its trace when ``n > 1``)."""
    trace, n = _chat_trace(turn), int(turn.body.get("n") or 1)
    choice = {"index": 0, "message": _chat_message(turn), "finish_reason": turn.step.finish, "logprobs": None}
    choices = [choice | {"index": i} | (trace.as_field() if n > 1 else {}) for i in range(n)]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": turn.model,
        "choices": choices,
        "usage": _chat_usage(trace, n),
        **(trace.as_field() if n == 1 else {}),
    }


def _chat_usage(trace: TokenTrace, n: int = 1) -> dict[str, int]:
    prompt, completion = len(trace.prompt_token_ids), n * len(trace.completion_token_ids)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_chunks(turn: _Turn) -> Iterator[dict[str, Any]]:
    """The chunks of the streamed chat completion; the last one carries the trace."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time())}
    head["model"] = turn.model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    yield chunk({"role": "assistant", "content": ""})
    for piece in _pieces(turn.step.text):
        yield chunk({"content": piece})
    for j, call in enumerate(turn.step.tool_calls):
        function = {"name": call.name, "arguments": ""}
        yield chunk({"tool_calls": [{"index": j, "id": turn.call_id(j), "type": "function", "function": function}]})
        for piece in _pieces(call.arguments_json()):
            yield chunk({"tool_calls": [{"index": j, "function": {"arguments": piece}}]})
    trace = _chat_trace(turn)
    last = chunk({}, turn.step.finish)
    if (turn.body.get("stream_options") or {}).get("include_usage"):
        yield last
        last = head | {"choices": [], "usage": _chat_usage(trace)}
    yield last | trace.as_field()


# ---------------------------------------------------------------------------------------------------- responses
def _output_items(turn: _Turn) -> list[dict[str, Any]]:
    step, items = turn.step, []
    if step.text or not step.tool_calls:
        content = [{"type": "output_text", "text": step.text, "annotations": []}]
        message = {"type": "message", "id": f"msg_{turn.index}", "status": "completed", "role": "assistant"}
        items.append(message | {"content": content})
    for j, call in enumerate(step.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{turn.index}_{j}",
                "call_id": turn.call_id(j),
                "name": call.name,
                "arguments": call.arguments_json(),
                "status": "completed",
            }
        )
    return items


def response_object(turn: _Turn, response_id: str, *, final: bool = True) -> dict[str, Any]:
    """The Responses API response object (``final=False``: as announced by ``response.created``)."""
    output = _output_items(turn) if final else []
    incomplete = turn.step.finish == "length"
    status = ("incomplete" if incomplete else "completed") if final else "in_progress"
    obj: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": turn.model,
        "output": output,
        "incomplete_details": {"reason": "max_output_tokens"} if final and incomplete else None,
        "parallel_tool_calls": True,
        "tool_choice": turn.body.get("tool_choice", "auto"),
        "tools": turn.tools,
    }
    if final:
        trace = turn.trace(render(output))
        prompt, completion = len(trace.prompt_token_ids), len(trace.completion_token_ids)
        obj["usage"] = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
        obj |= trace.as_field()
    return obj


def response_events(turn: _Turn) -> Iterator[dict[str, Any]]:
    """The events of the streamed response, ``response.created`` to ``response.completed`` (with the trace)."""
    response_id = f"resp_{uuid.uuid4().hex}"
    yield {"type": "response.created", "response": response_object(turn, response_id, final=False)}
    for index, item in enumerate(_output_items(turn)):
        yield from _item_events(index, item)
    yield {"type": "response.completed", "response": response_object(turn, response_id)}


def _item_events(index: int, item: dict[str, Any]) -> Iterator[dict[str, Any]]:
    where = {"output_index": index, "item_id": item["id"]}
    if item["type"] == "message":
        text = item["content"][0]["text"]
        yield {"type": "response.output_item.added", "output_index": index, "item": item | {"content": []}}
        part = {"type": "output_text", "text": "", "annotations": []}
        yield {"type": "response.content_part.added", **where, "content_index": 0, "part": part}
        for piece in _pieces(text):
            yield {"type": "response.output_text.delta", **where, "content_index": 0, "delta": piece}
        yield {"type": "response.output_text.done", **where, "content_index": 0, "text": text}
        yield {"type": "response.content_part.done", **where, "content_index": 0, "part": part | {"text": text}}
    else:
        added = item | {"arguments": "", "status": "in_progress"}
        yield {"type": "response.output_item.added", "output_index": index, "item": added}
        for piece in _pieces(item["arguments"]):
            yield {"type": "response.function_call_arguments.delta", **where, "delta": piece}
        yield {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]}
    yield {"type": "response.output_item.done", "output_index": index, "item": item}


def _pieces(text: str) -> Iterator[str]:
    for start in range(0, len(text), STREAM_PIECE_CHARS):
        yield text[start : start + STREAM_PIECE_CHARS]


# ---------------------------------------------------------------------------------------------------- app
def _error(status: int, message: str, code: str = "invalid_request") -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)


async def _sse(events: Iterator[dict[str, Any]], flavour: Flavour) -> AsyncIterator[bytes]:
    for sequence, event in enumerate(events):
        data = to_json(event if flavour == "chat" else event | {"sequence_number": sequence}).decode()
        yield (f"data: {data}\n\n" if flavour == "chat" else f"event: {event['type']}\ndata: {data}\n\n").encode()
    if flavour == "chat":
        yield b"data: [DONE]\n\n"


def create_scripted_app(
    plan: ScriptedPlan, policy_version: int = 0, tokenizer: TraceTokenizer | None = None
) -> FastAPI:
    """An OpenAI-compatible app replaying ``plan``; every completion reports ``policy_version`` in its trace.

    With ``tokenizer`` (chat completions only) the token ids are the policy's own, so recorded demonstrations can be
    trained on; without it they come from the built-in byte tokenizer above."""
    app = FastAPI(title="Orchard scripted backend", docs_url=None, redoc_url=None, openapi_url=None)
    cursors: dict[str, int] = {}

    async def answer(request: Request, flavour: Flavour) -> Response:
        try:
            body = _parse_body(await request.body())
            items = _request_items(flavour, body)
        except ScriptedRequestError as exc:
            return _error(400, str(exc))
        key = _plan_key(request, body)
        index = cursors.get(key, 0)
        cursors[key] = index + 1
        step = plan.step(index)
        tools = body.get("tools") or []
        turn = _Turn(flavour, body, items, tools, step, index, policy_version, tokenizer)
        log.debug("scripted reply", plan_key=key, index=index, flavour=flavour)
        if step.delay_s:
            await asyncio.sleep(step.delay_s)
        if body.get("stream"):
            events = chat_chunks(turn) if flavour == "chat" else response_events(turn)
            return StreamingResponse(_sse(events, flavour), media_type="text/event-stream")
        payload = chat_completion(turn) if flavour == "chat" else response_object(turn, f"resp_{uuid.uuid4().hex}")
        return Response(to_json(payload), media_type="application/json")

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await answer(request, "chat")

    @app.post("/v1/responses")
    async def responses(request: Request) -> Response:
        return await answer(request, "responses")

    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> Response:
        try:
            body = _parse_body(await request.body())
            items = _request_items("chat", body)
        except ScriptedRequestError as exc:
            return _error(400, str(exc))
        ids = _prompt_ids(items, body.get("tools") or [], tokenizer)
        return JSONResponse({"count": len(ids), "max_model_len": None, "tokens": ids})

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return model_list(plan.model)

    return app


def _prompt_ids(items: list[dict[str, Any]], tools: list[Any], tokenizer: TraceTokenizer | None) -> list[int]:
    """The prompt token ids a chat request renders to, as its trace would report them."""
    if tokenizer is None:
        return render(items, tools)
    return tokenizer.chat_trace_ids(items, tools, {"role": "assistant", "content": ""})[0]
