"""OpenAI response objects, chunks and events built from the engine's completions, each with its token trace.

Where the trace goes follows ``orchard.engines.token_trace`` exactly: top level of a chat completion (per choice
when ``n > 1``), top level of the last chat chunk before ``[DONE]``, top level of a response object, and inside the
``response`` of ``response.completed``. A streamed answer carries the same trace, token ids and text as the
non-streamed one: both are built from the same ``Completion``, and streamed text is the detokenizer's and the tool
filter's releases, which add up to the final content.

Legacy ``/v1/completions`` objects (``text_completion``) carry no trace: their ``logprobs`` object is OpenAI's
(``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``), with the prompt's tokens first when ``echo``
(the first of them without a logprob, ``null``), and token strings as ``"token_id:<id>"`` when
``return_tokens_as_token_ids`` (vLLM's extension) was asked.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from orchard.engines.batching import Completion, FinishEvent, GenerationHandle
from orchard.engines.openai_requests import CompletionRequest, PromptRequest
from orchard.engines.responses_events import function_call_events, message_done_events
from orchard.engines.token_trace import TokenTrace
from orchard.engines.tool_parsing import ParsedOutput, ToolCallStreamFilter, parse_tool_calls


@dataclass(frozen=True)
class Answer:
    """One completion read as the API answers it: content, tool calls (with ids) and the finish reason."""

    completion: Completion
    parsed: ParsedOutput
    call_ids: tuple[str, ...]

    @classmethod
    def of(cls, request: PromptRequest, completion: Completion) -> Answer:
        """Parse tool calls when the request declared tools (and did not say ``tool_choice: none``)."""
        parsed = parse_tool_calls(completion.text) if request.parse_tools else ParsedOutput(completion.text)
        return cls(completion, parsed, tuple(f"call_{uuid.uuid4().hex[:24]}" for _ in parsed.tool_calls))

    @property
    def finish_reason(self) -> str:
        """``tool_calls`` when there are any, else the engine's (``stop`` or ``length``)."""
        return "tool_calls" if self.parsed.tool_calls else self.completion.finish_reason

    def trace(self, prompt_ids: list[int]) -> TokenTrace:
        """The token trace of this completion."""
        return TokenTrace(
            prompt_token_ids=prompt_ids,
            completion_token_ids=self.completion.token_ids,
            completion_logprobs=self.completion.logprobs,
            policy_version=self.completion.policy_version,
        )


@dataclass
class Reply:
    """Identity shared by every object of one answer."""

    request: PromptRequest
    prompt_ids: list[int]
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


# ---------------------------------------------------------------------------------------------------- chat
def chat_message(answer: Answer) -> dict[str, Any]:
    """The assistant message of a chat choice."""
    message: dict[str, Any] = {"role": "assistant", "content": answer.parsed.content}
    if answer.parsed.tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
            for call_id, call in zip(answer.call_ids, answer.parsed.tool_calls, strict=True)
        ]
    return message


def chat_completion(reply: Reply, completions: list[Completion]) -> dict[str, Any]:
    """The non-streamed chat completion object."""
    answers = [Answer.of(reply.request, c) for c in completions]
    many = len(answers) > 1
    choices = [
        {"index": a.completion.index, "message": chat_message(a), "finish_reason": a.finish_reason, "logprobs": None}
        | (a.trace(reply.prompt_ids).as_field() if many else {})
        for a in answers
    ]
    obj = {
        "id": f"chatcmpl-{reply.id}",
        "object": "chat.completion",
        "created": reply.created,
        "model": reply.request.model,
        "choices": choices,
        "usage": _chat_usage(len(reply.prompt_ids), sum(len(c.token_ids) for c in completions)),
    }
    return obj | ({} if many else answers[0].trace(reply.prompt_ids).as_field())


def _chat_usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


async def chat_chunks(reply: Reply, handle: GenerationHandle) -> AsyncIterator[dict[str, Any]]:
    """The chunks of a streamed chat completion (``n == 1``); the last one carries the trace."""
    head = {"id": f"chatcmpl-{reply.id}", "object": "chat.completion.chunk", "created": reply.created}
    head["model"] = reply.request.model

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return head | {"choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}

    yield chunk({"role": "assistant", "content": ""})
    tool_filter = ToolCallStreamFilter() if reply.request.parse_tools else None
    async for event in handle.events():
        piece = tool_filter.push(event.text) if tool_filter else event.text
        if piece:
            yield chunk({"content": piece})
        if isinstance(event, FinishEvent):
            answer = Answer.of(reply.request, event.completion)
            rest = tool_filter.finish(answer.parsed.content) if tool_filter else ""
            if rest:
                yield chunk({"content": rest})
            for j, call in enumerate(chat_message(answer).get("tool_calls", [])):
                yield chunk({"tool_calls": [{"index": j, **call}]})
            last = chunk({}, answer.finish_reason)
            if reply.request.include_usage:
                yield last
                last = head | {
                    "choices": [],
                    "usage": _chat_usage(len(reply.prompt_ids), len(event.completion.token_ids)),
                }
            yield last | answer.trace(reply.prompt_ids).as_field()


# ---------------------------------------------------------------------------------------------------- responses
def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _function_item(index: int, call_id: str, name: str, arguments: str, item_id: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{item_id}_{index}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def output_items(answer: Answer, item_id: str) -> list[dict[str, Any]]:
    """The output items of a response: a message (unless it is only tool calls), then one per tool call."""
    items = []
    if answer.parsed.content is not None or not answer.parsed.tool_calls:
        items.append(_message_item(f"msg_{item_id}", answer.parsed.content or ""))
    for j, (call_id, call) in enumerate(zip(answer.call_ids, answer.parsed.tool_calls, strict=True)):
        items.append(_function_item(j, call_id, call.name, call.arguments, item_id))
    return items


def response_object(reply: Reply, answer: Answer | None) -> dict[str, Any]:
    """The response object: ``answer=None`` as announced by ``response.created`` (in progress)."""
    body = reply.request.body
    obj: dict[str, Any] = {
        "id": f"resp_{reply.id}",
        "object": "response",
        "created_at": reply.created,
        "status": "in_progress",
        "model": reply.request.model,
        "output": [],
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "temperature": reply.request.temperature,
        "top_p": reply.request.top_p,
    }
    if answer is None:
        return obj
    incomplete = answer.finish_reason == "length"
    obj["status"] = "incomplete" if incomplete else "completed"
    obj["incomplete_details"] = {"reason": "max_output_tokens"} if incomplete else None
    obj["output"] = output_items(answer, reply.id)
    prompt, completion = len(reply.prompt_ids), len(answer.completion.token_ids)
    obj["usage"] = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
    return obj | answer.trace(reply.prompt_ids).as_field()


async def response_events(reply: Reply, handle: GenerationHandle) -> AsyncIterator[dict[str, Any]]:
    """The events of a streamed response, ``response.created`` to ``response.completed`` (with the trace)."""
    yield {"type": "response.created", "response": response_object(reply, None)}
    yield {"type": "response.in_progress", "response": response_object(reply, None)}
    message = _StreamedMessage(f"msg_{reply.id}")
    tool_filter = ToolCallStreamFilter() if reply.request.parse_tools else None
    async for event in handle.events():
        piece = tool_filter.push(event.text) if tool_filter else event.text
        for out in message.delta(piece):
            yield out
        if isinstance(event, FinishEvent):
            answer = Answer.of(reply.request, event.completion)
            items = output_items(answer, reply.id)
            rest = tool_filter.finish(answer.parsed.content) if tool_filter else ""
            if items[0]["type"] == "message":
                for out in [*message.delta(rest, force=True), *message.done(items[0])]:
                    yield out
            for index, item in enumerate(items):
                if item["type"] == "function_call":
                    for out in function_call_events(index, item):
                        yield out
            yield {"type": "response.completed", "response": response_object(reply, answer)}


@dataclass
class _StreamedMessage:
    """The message item of a streamed response: announced on its first text, closed at the end."""

    item_id: str
    started: bool = False

    def delta(self, piece: str, force: bool = False) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if (piece or force) and not self.started:
            self.started = True
            events.append(
                {
                    "type": "response.output_item.added",
                    "output_index": 0,
                    "item": _message_item(self.item_id, "", status="in_progress"),
                }
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append({"type": "response.content_part.added", **self._where(), "part": part})
        if piece:
            events.append({"type": "response.output_text.delta", **self._where(), "delta": piece})
        return events

    def done(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        return message_done_events(self.item_id, item)

    def _where(self) -> dict[str, Any]:
        return {"output_index": 0, "item_id": self.item_id, "content_index": 0}


# ---------------------------------------------------------------------------------------------------- completions
@dataclass(frozen=True)
class CompletionChoice:
    """One choice of a legacy completion: the tokens it shows, their logprobs and alternatives, its text.

    ``token_ids`` is the echoed prompt (when ``echo``) followed by the generated tokens; ``logprobs[i]`` is None
    only for the first token of an echoed prompt; ``top[i]`` maps token id to logprob (see
    ``orchard.engines.scoring.SequenceScores``).
    """

    text: str
    token_ids: list[int]
    logprobs: list[float | None]
    top: list[dict[int, float] | None]
    finish_reason: str


def text_completion(
    request: CompletionRequest,
    reply_id: str,
    choices: list[CompletionChoice],
    usage: tuple[int, int],
    token_text: Callable[[int], str],
) -> dict[str, Any]:
    """The ``text_completion`` object; ``usage`` is (prompt tokens, completion tokens), ``token_text`` one token's
    text."""
    return {
        "id": f"cmpl-{reply_id}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": request.model,
        "choices": [
            {
                "index": index,
                "text": choice.text,
                "logprobs": None if request.logprobs is None else _logprobs_object(request, choice, token_text),
                "finish_reason": choice.finish_reason,
            }
            for index, choice in enumerate(choices)
        ],
        "usage": _chat_usage(*usage),
    }


def _logprobs_object(
    request: CompletionRequest, choice: CompletionChoice, token_text: Callable[[int], str]
) -> dict[str, Any]:
    def name(token: int) -> str:
        return f"token_id:{token}" if request.tokens_as_ids else token_text(token)

    pieces = [token_text(token) for token in choice.token_ids]
    offsets, offset = [], 0
    for piece in pieces:
        offsets.append(offset)
        offset += len(piece)
    return {
        "tokens": [name(token) for token in choice.token_ids],
        "token_logprobs": choice.logprobs,
        "top_logprobs": [None if top is None else {name(t): lp for t, lp in top.items()} for top in choice.top],
        "text_offset": offsets,
    }
