"""Orchard's ``/v1/responses`` answered through vLLM's chat completions: response objects and streamed events.

The shim reads a Responses request as chat messages (``orchard.engines.openai_requests.responses_request``, the
same reading as the local engine), asks vLLM's chat API, and builds the response object (or the streamed events)
from the ``ChatAnswer`` read out of vLLM's answer: the same shapes as ``orchard.engines.openai_output``, with the
trace at the top level of the response object and inside the ``response`` of ``response.completed``. Reasoning
text, which the Responses API would put in reasoning items, is not forwarded.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchard.engines.openai_requests import PromptRequest
from orchard.engines.responses_events import function_call_events, message_done_events
from orchard.engines.vllm_mapping import ChatAnswer, StreamAccumulator, read_chat_completion


@dataclass
class ResponseIdentity:
    """Id and creation time shared by every object of one response."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))


def _message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def output_items(answer: ChatAnswer, response_id: str) -> list[dict[str, Any]]:
    """A message item (unless the answer is only tool calls), then one ``function_call`` item per call."""
    items = []
    if answer.content is not None or not answer.tool_calls:
        items.append(_message_item(f"msg_{response_id}", answer.content or ""))
    for j, call in enumerate(answer.tool_calls):
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{response_id}_{j}",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            }
        )
    return items


def response_object(request: PromptRequest, identity: ResponseIdentity, answer: ChatAnswer | None) -> dict[str, Any]:
    """The response object; ``answer=None``: as ``response.created`` announces it (in progress)."""
    body = request.body
    obj: dict[str, Any] = {
        "id": f"resp_{identity.id}",
        "object": "response",
        "created_at": identity.created,
        "status": "in_progress",
        "model": request.model,
        "output": [],
        "incomplete_details": None,
        "instructions": body.get("instructions"),
        "parallel_tool_calls": True,
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "temperature": request.temperature,
        "top_p": request.top_p,
    }
    if answer is None:
        return obj
    incomplete = answer.finish_reason == "length"
    obj["status"] = "incomplete" if incomplete else "completed"
    obj["incomplete_details"] = {"reason": "max_output_tokens"} if incomplete else None
    obj["output"] = output_items(answer, identity.id)
    prompt, completion = len(answer.trace.prompt_token_ids), len(answer.trace.completion_token_ids)
    obj["usage"] = {"input_tokens": prompt, "output_tokens": completion, "total_tokens": prompt + completion}
    return obj | answer.trace.as_field()


def response_from_chat(raw: Mapping[str, Any], request: PromptRequest, version: int) -> dict[str, Any]:
    """The response object for a non-streamed vLLM chat completion (its first choice)."""
    return response_object(request, ResponseIdentity(), read_chat_completion(raw, version)[0])


class ResponseStreamMapper:
    """A streamed vLLM chat completion as the Responses API's events; ``finish`` ends with ``response.completed``."""

    def __init__(self, request: PromptRequest, version: int) -> None:
        self.request = request
        self.identity = ResponseIdentity()
        self.state = StreamAccumulator(version)
        self._item_id = f"msg_{self.identity.id}"
        self._opened = False
        self._message_started = False

    def _open(self) -> list[dict[str, Any]]:
        if self._opened:
            return []
        self._opened = True
        created = response_object(self.request, self.identity, None)
        return [
            {"type": "response.created", "response": created},
            {"type": "response.in_progress", "response": created},
        ]

    def _where(self) -> dict[str, Any]:
        return {"output_index": 0, "item_id": self._item_id, "content_index": 0}

    def _text(self, piece: str, force: bool = False) -> list[dict[str, Any]]:
        events: list[dict[str, Any]] = []
        if (piece or force) and not self._message_started:
            self._message_started = True
            item = _message_item(self._item_id, "", status="in_progress")
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append({"type": "response.output_item.added", "output_index": 0, "item": item})
            events.append({"type": "response.content_part.added", **self._where(), "part": part})
        if piece:
            events.append({"type": "response.output_text.delta", **self._where(), "delta": piece})
        return events

    def push(self, chunk: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The events for one vLLM chunk: text deltas as they come (tool calls are sent whole at the end)."""
        events = self._open()
        for delta in self.state.push(chunk):
            events.extend(self._text(delta.get("content") or ""))
        return events

    def finish(self) -> list[dict[str, Any]]:
        """The closing events: the message item done, each tool call, and ``response.completed`` with the trace."""
        events = self._open()
        answer = self.state.answer()
        items = output_items(answer, self.identity.id)
        if items[0]["type"] == "message":
            events += self._text("", force=True)
            events += message_done_events(self._item_id, items[0])
        for index, item in enumerate(items):
            if item["type"] == "function_call":
                events += function_call_events(index, item)
        events.append({"type": "response.completed", "response": response_object(self.request, self.identity, answer)})
        return events
