"""Orchard's engine API onto vLLM's chat completions and back: pure functions, no I/O, no vLLM import.

The shim (``orchard.engines.vllm_backend``) checks each request exactly as the local engine does
(``orchard.engines.openai_requests``), then asks vLLM's ``/v1/chat/completions`` for it with the fields the token
trace needs, documented in vLLM's OpenAI-compatible server (extra parameters of the chat API, vLLM >= 0.10.2):

- ``return_token_ids: true``: the response carries ``prompt_token_ids`` (top level; in a stream, on the first
  chunk only) and each choice its ``token_ids`` (in a stream, each chunk's delta tokens, sent even when the tool
  parser holds the text back);
- ``logprobs: true, top_logprobs: 0``: ``choices[].logprobs.content[]`` holds one ``{token, logprob}`` per sampled
  token. vLLM V1 reports raw logprobs by default (``--logprobs-mode raw_logprobs``: log-softmax of the model's
  logits, before temperature and penalties), which is what the local engine records;
- ``return_tokens_as_token_ids: true``: those ``token`` strings read ``token_id:N``, which lets the mapping check
  that both lists name the same tokens (and recover the ids from a vLLM that lacks ``return_token_ids``).

Back, vLLM's answer becomes the same OpenAI objects the local engine sends, with the ``orchard`` trace placed as
``orchard.engines.token_trace`` says and the policy version the shim served the request on. vLLM-only fields
(``token_ids``, ``prompt_token_ids``, ``stop_reason``, ``logprobs``) are dropped: the trace carries them. An answer
without complete token ids and logprobs raises ``VLLMProtocolError`` (HTTP 502): a response whose tokens cannot be
recorded must not reach the proxy looking valid.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchard.engines.exceptions import GenerationFailedError
from orchard.engines.openai_requests import PromptRequest
from orchard.engines.token_trace import TokenTrace

TOKEN_ID_PREFIX = "token_id:"  # noqa: S105 - vLLM's token-string prefix, not a password


class VLLMProtocolError(GenerationFailedError):
    """vLLM answered, but not with what the token trace needs (token ids, one logprob per token); HTTP 502."""


@dataclass(frozen=True, slots=True)
class ToolCallOut:
    """One tool call of an answer, as vLLM's tool parser read it."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ChatAnswer:
    """One choice of a vLLM answer, read: content, tool calls, finish reason and the token trace."""

    index: int
    content: str | None
    tool_calls: tuple[ToolCallOut, ...]
    finish_reason: str
    trace: TokenTrace
    reasoning: str | None = None

    def message(self) -> dict[str, Any]:
        """The assistant message of a chat choice."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            message["reasoning_content"] = self.reasoning
        if self.tool_calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self.tool_calls
            ]
        return message


# ---------------------------------------------------------------------------------------------------- requests
def vllm_chat_body(
    request: PromptRequest, model: str, *, default_max_tokens: int | None = None, parse_tools: bool = True
) -> dict[str, Any]:
    """The vLLM ``/v1/chat/completions`` body for a checked request of either API.

    ``model`` is the name vLLM serves; ``default_max_tokens`` applies when the request gives none (as the local
    engine does); ``parse_tools=False`` (vLLM runs without a tool-call parser) turns ``tool_choice: auto`` into
    ``none``, so tools are still rendered into the prompt but vLLM is not asked to parse calls it cannot.
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": request.messages,
        "n": request.n if request.flavour == "chat" else 1,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stream": request.stream,
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    max_tokens = request.max_tokens if request.max_tokens is not None else default_max_tokens
    if max_tokens is not None:
        body["max_completion_tokens"] = max_tokens
    if request.stop:
        body["stop"] = list(request.stop)
    if request.seed is not None:
        body["seed"] = request.seed
    if request.stream:
        body["stream_options"] = {"include_usage": True}  # the shim builds the client's usage itself
    if request.tools:
        body["tools"] = request.tools
        body["tool_choice"] = _tool_choice(request, parse_tools)
    return body


def _tool_choice(request: PromptRequest, parse_tools: bool) -> Any:
    choice = request.body.get("tool_choice", "auto")
    if isinstance(choice, Mapping) and choice.get("type") == "function" and "function" not in choice:
        choice = {"type": "function", "function": {"name": choice.get("name")}}  # the Responses API's shape
    if not parse_tools and choice == "auto":
        return "none"
    return choice


# ---------------------------------------------------------------------------------------------------- responses
def vllm_error_message(payload: Any) -> str:
    """The message of a vLLM error body (``{"error": {...}}`` or the older flat ``{"object": "error", ...}``)."""
    if isinstance(payload, Mapping):
        inner = payload.get("error", payload)
        if isinstance(inner, Mapping) and isinstance(inner.get("message"), str):
            return inner["message"]
        if isinstance(inner, str):
            return inner
        detail = payload.get("detail")
        if detail is not None:
            return str(detail)
    return json.dumps(payload)[:500] if not isinstance(payload, str) else payload[:500]


def read_choice(prompt_ids: list[int], choice: Mapping[str, Any], version: int) -> ChatAnswer:
    """A non-streamed vLLM chat choice, read and traced."""
    message = choice.get("message") or {}
    calls = tuple(_tool_call(c, i) for i, c in enumerate(message.get("tool_calls") or []))
    if choice.get("token_ids") is None and not _logprob_entries(choice):
        raise VLLMProtocolError("vLLM returned neither token_ids nor logprobs for a choice (needs vLLM >= 0.10.2)")
    token_ids = completion_token_ids(choice.get("token_ids"), _logprob_entries(choice))
    trace = _trace(prompt_ids, token_ids, _logprob_values(_logprob_entries(choice)), version)
    return ChatAnswer(
        index=int(choice.get("index", 0)),
        content=message.get("content"),
        tool_calls=calls,
        finish_reason=finish_reason(choice.get("finish_reason"), bool(calls)),
        trace=trace,
        reasoning=message.get("reasoning_content") or message.get("reasoning"),
    )


def read_chat_completion(raw: Mapping[str, Any], version: int) -> list[ChatAnswer]:
    """Every choice of a non-streamed vLLM chat completion, in index order."""
    prompt_ids = prompt_token_ids(raw.get("prompt_token_ids"))
    choices = raw.get("choices")
    if not isinstance(choices, list) or not choices:
        raise VLLMProtocolError("vLLM answered without choices")
    return sorted((read_choice(prompt_ids, c, version) for c in choices), key=lambda a: a.index)


def chat_completion(raw: Mapping[str, Any], request: PromptRequest, version: int) -> dict[str, Any]:
    """The Orchard chat completion for a non-streamed vLLM answer (trace top level, or per choice when n > 1)."""
    answers = read_chat_completion(raw, version)
    many = len(answers) > 1
    choices = [
        {"index": a.index, "message": a.message(), "finish_reason": a.finish_reason, "logprobs": None}
        | (a.trace.as_field() if many else {})
        for a in answers
    ]
    prompt = len(answers[0].trace.prompt_token_ids)
    obj = {
        "id": str(raw.get("id") or f"chatcmpl-{uuid.uuid4().hex}"),
        "object": "chat.completion",
        "created": int(raw.get("created") or time.time()),
        "model": request.model,
        "choices": choices,
        "usage": usage(prompt, sum(len(a.trace.completion_token_ids) for a in answers)),
    }
    return obj | ({} if many else answers[0].trace.as_field())


def usage(prompt: int, completion: int) -> dict[str, int]:
    """Chat-completions usage counted from the trace (what the proxy records), not from vLLM's own count."""
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def finish_reason(raw: Any, has_tool_calls: bool) -> str:
    """vLLM's finish reason; ``tool_calls`` whenever the answer has any (as the local engine says)."""
    if has_tool_calls:
        return "tool_calls"
    return str(raw) if raw else "stop"


def prompt_token_ids(raw: Any) -> list[int]:
    """The prompt token ids vLLM returned; ``VLLMProtocolError`` if absent (vLLM older than 0.10.2)."""
    if not isinstance(raw, list) or not all(isinstance(t, int) for t in raw):
        raise VLLMProtocolError("vLLM returned no prompt_token_ids: it must support return_token_ids (vLLM >= 0.10.2)")
    return list(raw)


def completion_token_ids(raw: Any, entries: list[Mapping[str, Any]]) -> list[int]:
    """A choice's token ids: its ``token_ids``, checked against (or else read from) the ``token_id:N`` logprobs."""
    from_logprobs = [_id_of(e.get("token")) for e in entries]
    if isinstance(raw, list) and all(isinstance(t, int) for t in raw):
        known = [(i, t) for i, t in enumerate(from_logprobs) if t is not None]
        if len(from_logprobs) == len(raw) and any(raw[i] != t for i, t in known):
            raise VLLMProtocolError("vLLM's token_ids and the tokens of its logprobs disagree")
        return list(raw)
    if entries and all(t is not None for t in from_logprobs):
        return [t for t in from_logprobs if t is not None]
    if not entries and raw is None:
        return []
    raise VLLMProtocolError("vLLM returned no token_ids for a choice: it must support return_token_ids")


def _id_of(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith(TOKEN_ID_PREFIX):
        try:
            return int(token[len(TOKEN_ID_PREFIX) :])
        except ValueError:
            return None
    return None


def _logprob_entries(choice: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    logprobs = choice.get("logprobs")
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    return list(content) if isinstance(content, list) else []


def _logprob_values(entries: list[Mapping[str, Any]]) -> list[float]:
    values = [e.get("logprob") for e in entries]
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        raise VLLMProtocolError("vLLM returned a logprob entry without a number")
    return [float(v) for v in values]  # type: ignore[arg-type]


def _trace(prompt_ids: list[int], token_ids: list[int], logprobs: list[float], version: int) -> TokenTrace:
    if len(logprobs) != len(token_ids):
        raise VLLMProtocolError(
            f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens (was logprobs requested?)"
        )
    return TokenTrace(
        prompt_token_ids=prompt_ids, completion_token_ids=token_ids, completion_logprobs=logprobs,
        policy_version=version,
    )  # fmt: skip


def _tool_call(raw: Any, position: int) -> ToolCallOut:
    function = raw.get("function") if isinstance(raw, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise VLLMProtocolError(f"vLLM returned a malformed tool call at position {position}")
    arguments = function.get("arguments") or "{}"
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    call_id = raw.get("id") or f"call_{uuid.uuid4().hex[:24]}"
    return ToolCallOut(str(call_id), function["name"], arguments)


# ---------------------------------------------------------------------------------------------------- streams
@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class StreamAccumulator:
    """What a streamed vLLM answer (one choice) has said so far; ``answer()`` reads it once it has finished."""

    version: int
    prompt_ids: list[int] | None = None
    token_ids: list[int] = field(default_factory=list)
    entries: list[Mapping[str, Any]] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    calls: dict[int, _PartialCall] = field(default_factory=dict)
    raw_finish: str | None = None
    id: str | None = None
    created: int | None = None

    def push(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Take one vLLM chunk; return the deltas it carries for the client (content, reasoning, tool calls)."""
        if "error" in chunk:
            raise GenerationFailedError(f"vLLM failed while streaming: {vllm_error_message(chunk)}")
        self.id = self.id or chunk.get("id")
        self.created = self.created or chunk.get("created")
        if chunk.get("prompt_token_ids") is not None:
            self.prompt_ids = prompt_token_ids(chunk["prompt_token_ids"])
        deltas: list[dict[str, Any]] = []
        for choice in chunk.get("choices") or []:
            deltas.extend(self._push_choice(choice))
        return deltas

    def _push_choice(self, choice: Mapping[str, Any]) -> list[dict[str, Any]]:
        entries = _logprob_entries(choice)
        self.token_ids.extend(completion_token_ids(choice.get("token_ids"), entries))
        self.entries.extend(entries)
        if choice.get("finish_reason"):
            self.raw_finish = str(choice["finish_reason"])
        delta = choice.get("delta") or {}
        out: list[dict[str, Any]] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            self.reasoning.append(reasoning)
            out.append({"reasoning_content": reasoning})
        if delta.get("content"):
            self.content.append(delta["content"])
            out.append({"content": delta["content"]})
        calls = [self._push_call(c) for c in delta.get("tool_calls") or []]
        if calls:
            out.append({"tool_calls": calls})
        return out

    def _push_call(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        index = int(raw.get("index", len(self.calls)))
        call = self.calls.setdefault(index, _PartialCall())
        function = raw.get("function") or {}
        call.id = call.id or str(raw.get("id") or "")
        call.name += function.get("name") or ""
        call.arguments += function.get("arguments") or ""
        out: dict[str, Any] = {"index": index}
        if raw.get("id"):
            out |= {"id": raw["id"], "type": "function"}
        return out | {"function": {k: function[k] for k in ("name", "arguments") if function.get(k) is not None}}

    @property
    def finished(self) -> bool:
        """Whether vLLM has sent the finish reason."""
        return self.raw_finish is not None

    def answer(self) -> ChatAnswer:
        """The finished answer with its trace; ``VLLMProtocolError`` if the stream ended early or is incomplete."""
        if not self.finished:
            raise VLLMProtocolError("vLLM's stream ended before a finish reason")
        if self.prompt_ids is None:
            prompt_token_ids(None)  # raises with the version hint
        if not self.token_ids:
            raise VLLMProtocolError("vLLM's stream carried no token ids (needs vLLM >= 0.10.2, return_token_ids)")
        calls = tuple(
            ToolCallOut(c.id or f"call_{uuid.uuid4().hex[:24]}", c.name, c.arguments or "{}")
            for _, c in sorted(self.calls.items())
        )
        content = "".join(self.content)
        return ChatAnswer(
            index=0,
            content=None if calls and not content else content,  # as vLLM's parsers say it unstreamed
            tool_calls=calls,
            finish_reason=finish_reason(self.raw_finish, bool(calls)),
            trace=_trace(self.prompt_ids or [], self.token_ids, _logprob_values(self.entries), self.version),
            reasoning="".join(self.reasoning) or None,
        )


class ChatStreamMapper:
    """A streamed vLLM chat completion (``n == 1``) as the Orchard chunks of the local engine.

    ``push`` each vLLM chunk and send what it returns; ``finish`` (after vLLM's ``[DONE]``) returns the closing
    chunks: the finish reason, then (with ``stream_options.include_usage``) the usage chunk; the last one carries
    the trace. Tool calls stream as vLLM's parser releases them (OpenAI's incremental ``tool_calls`` deltas).
    """

    def __init__(self, request: PromptRequest, version: int) -> None:
        self.request = request
        self.state = StreamAccumulator(version)
        self._head: dict[str, Any] | None = None

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        if self._head is None:
            self._head = {
                "id": str(self.state.id or f"chatcmpl-{uuid.uuid4().hex}"),
                "object": "chat.completion.chunk",
                "created": int(self.state.created or time.time()),
                "model": self.request.model,
            }
        return self._head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    def push(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The client chunks for one vLLM chunk (the first call also sends the role chunk)."""
        first = self._head is None
        deltas = self.state.push(chunk)
        out = [self._chunk({"role": "assistant", "content": ""})] if first else []
        return out + [self._chunk(d) for d in deltas]

    def finish(self) -> list[dict[str, Any]]:
        """The closing chunks; the last carries the trace."""
        answer = self.state.answer()
        head = [] if self._head is not None else [self._chunk({"role": "assistant", "content": ""})]
        last = self._chunk({}, answer.finish_reason)
        closing = [*head]
        if self.request.include_usage:
            closing.append(last)
            prompt, completion = len(answer.trace.prompt_token_ids), len(answer.trace.completion_token_ids)
            last = {k: v for k, v in last.items() if k != "choices"} | {
                "choices": [],
                "usage": usage(prompt, completion),
            }
        closing.append(last | answer.trace.as_field())
        return closing
