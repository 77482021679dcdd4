"""Closing events of the OpenAI Responses stream, shared by every engine that serves ``/v1/responses``.

Kept free of torch so the vLLM shim (which runs without it) and the local engine emit the very same shapes.
"""

from __future__ import annotations

from typing import Any


def message_done_events(item_id: str, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The events that close the streamed message ``item`` (output index 0, content part 0)."""
    where = {"output_index": 0, "item_id": item_id, "content_index": 0}
    text = item["content"][0]["text"]
    part = {"type": "output_text", "text": text, "annotations": []}
    return [
        {"type": "response.output_text.done", **where, "text": text},
        {"type": "response.content_part.done", **where, "part": part},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
    ]


def function_call_events(index: int, item: dict[str, Any]) -> list[dict[str, Any]]:
    """The events of one complete function-call output item at ``index`` (its arguments in one delta)."""
    where = {"output_index": index, "item_id": item["id"]}
    return [
        {
            "type": "response.output_item.added",
            "output_index": index,
            "item": item | {"arguments": "", "status": "in_progress"},
        },
        {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
        {"type": "response.function_call_arguments.done", **where, "arguments": item["arguments"]},
        {"type": "response.output_item.done", "output_index": index, "item": item},
    ]
