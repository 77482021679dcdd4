"""Dataset layouts: which column (or key of a JSON column) holds each field of an imported trajectory, with presets.

A layout maps *fields* (what the importer needs) to *sources* in a row. A source is a column name, or a dotted path
into a column holding a JSON object (as a JSON string or a nested struct): ``metadata.instance_id`` reads key
``instance_id`` of column ``metadata``. Fields:

- ``messages``: the OpenAI-style chat messages of the trajectory (list, or a JSON string of one) — chat layouts;
- ``instruction`` / ``steps``: the task text and the per-step rollouts — the ``gui`` kind (see ``gui_messages``);
- ``success``: the dataset's label (bool, 0/1, or a word such as ``passed``/``resolved``/``failed``);
- ``reward``: a number (default: 1.0 on success, else 0.0); for ``gui`` the judged reward, success being
  ``reward >= success_threshold`` unless ``success`` is mapped too;
- ``signals``: an object of name → number; ``signal.<name>``: one more named number;
- ``task_id``, ``episode_id``, ``model``, ``tools``: optional identity, model name and tool definitions.

The ``orchard`` layout is not a mapping: it is the fixed layout ``orchard export`` writes (``orchard_format``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from orchard.datasets.exceptions import DatasetError, RowError

LayoutKind = Literal["chat", "gui", "orchard"]
FIELDS = ("messages", "instruction", "steps", "success", "reward", "signals", "task_id", "episode_id", "model", "tools")
SIGNAL_PREFIX = "signal."
TRUE_WORDS = frozenset({"true", "yes", "pass", "passed", "success", "succeeded", "resolved", "solved", "1"})
FALSE_WORDS = frozenset({"false", "no", "fail", "failed", "failure", "unresolved", "unsolved", "error", "0"})


class Layout(BaseModel):
    """A named mapping from trajectory fields to row sources (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(..., min_length=1, description="Preset name, recorded as the harness `dataset:<name>`.")
    kind: LayoutKind = Field("chat", description="chat: a messages column; gui: instruction + steps; orchard.")
    fields: dict[str, str] = Field(default_factory=dict, description="field (or signal.<name>) -> source path.")
    success_threshold: float = Field(0.5, description="gui: a judged reward at or above this counts as success.")

    def columns(self) -> set[str]:
        """The top-level columns the mapping reads (only these are read from a Parquet file)."""
        return {source.split(".", 1)[0] for source in self.fields.values()}

    def source(self, name: str) -> str | None:
        """The source path of field ``name``, if mapped."""
        return self.fields.get(name)


LAYOUTS: dict[str, Layout] = {
    layout.name: layout
    for layout in (
        Layout(
            name="orchard-swe",
            fields={
                "messages": "messages",
                "tools": "tools",
                "success": "verify_status",
                "task_id": "metadata.instance_id",
                "episode_id": "metadata.trajectory_id",
                "model": "metadata.model",
                "signals": "metadata.signals",
            },
        ),
        Layout(
            name="orchard-gui",
            kind="gui",
            fields={
                "instruction": "instruction",
                "steps": "steps",
                "reward": "reward",
                "task_id": "task_id",
                "episode_id": "trajectory_id",
                "model": "model",
            },
        ),
        Layout(name="swe-gym", fields={"messages": "messages", "success": "resolved", "task_id": "instance_id"}),
        Layout(
            name="swe-smith",
            fields={
                "messages": "messages",
                "success": "resolved",
                "task_id": "instance_id",
                "episode_id": "traj_id",
                "model": "model",
            },
        ),
        Layout(name="orchard", kind="orchard"),
        Layout(name="custom"),
    )
}
"""The presets: ``orchard-swe``, ``orchard-gui``, ``swe-gym``, ``swe-smith``, ``orchard`` (export's) and ``custom``."""


def parse_mapping(text: str) -> tuple[str, str]:
    """``SOURCE=FIELD`` from ``--map`` into ``(field, source)``; raise ``DatasetError`` naming the bad part."""
    source, sep, target = text.partition("=")
    source, target = source.strip(), target.strip()
    if not sep or not source or not target:
        raise DatasetError(f"--map {text!r}: expected SOURCE=FIELD, e.g. conversations=messages")
    if target not in FIELDS and not (target.startswith(SIGNAL_PREFIX) and len(target) > len(SIGNAL_PREFIX)):
        raise DatasetError(f"--map {text!r}: unknown field {target!r}; fields are {', '.join(FIELDS)}, signal.<name>")
    return target, source


def layout_with_overrides(name: str, mappings: list[str] | tuple[str, ...] = ()) -> Layout:
    """The preset ``name`` with ``--map SOURCE=FIELD`` overrides applied; checks the chat fields are mapped."""
    if name not in LAYOUTS:
        raise DatasetError(f"unknown layout {name!r}; choose one of {', '.join(LAYOUTS)}")
    layout = LAYOUTS[name]
    if mappings and layout.kind == "orchard":
        raise DatasetError("the orchard layout is fixed; --map applies to the other layouts")
    fields = dict(layout.fields)
    fields.update(parse_mapping(text) for text in mappings)
    layout = layout.model_copy(update={"fields": fields})
    required = {"chat": ("messages", "success"), "gui": ("steps",), "orchard": ()}[layout.kind]
    missing = [f for f in required if f not in fields]
    if missing:
        raise DatasetError(f"layout {name!r} needs a mapping for {', '.join(missing)} (--map SOURCE=FIELD)")
    return layout


def lookup(row: Mapping[str, Any], source: str) -> Any:
    """The value at ``source`` in ``row``: a column, or a dotted path into JSON objects (JSON strings are parsed)."""
    column, *keys = source.split(".")
    value: Any = row.get(column)
    for depth, key in enumerate(keys):
        value = as_json(value, ".".join([column, *keys[:depth]]))
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise RowError(f"{source}: expected an object at {key!r}, got {type(value).__name__}")
        value = value.get(key)
    return value


def as_json(value: Any, what: str) -> Any:
    """``value``, with a JSON string parsed (columns of JSON-as-text are common in published datasets)."""
    if isinstance(value, str | bytes) and value[:1] in ("{", "[", b"{", b"["):
        try:
            return json.loads(value)
        except ValueError as exc:
            raise RowError(f"{what}: invalid JSON: {exc}", "InvalidJsonError") from exc
    return value


def parse_success(value: Any, source: str) -> bool:
    """A dataset label as a bool: bools, 0/1, or words such as passed/resolved/failed (case-insensitive)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS | FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise RowError(f"{source}: cannot read {value!r} as a success label", "InvalidLabelError")


def parse_number(value: Any, source: str) -> float:
    """A finite number (bools count as 0/1)."""
    if isinstance(value, bool | int | float) and math.isfinite(float(value)):
        return float(value)
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            pass
        else:
            if math.isfinite(number):
                return number
    raise RowError(f"{source}: {value!r} is not a finite number", "InvalidNumberError")


@dataclass
class RowFields:
    """What the importer takes from one chat or gui row."""

    messages: list[dict[str, Any]]
    success: bool
    reward: float
    signals: dict[str, float] = field(default_factory=dict)
    task_id: str | None = None
    episode_id: str | None = None
    model: str | None = None
    tools: list[Any] = field(default_factory=list)
    artifact_uris: list[str] = field(default_factory=list)


def extract(row: Mapping[str, Any], layout: Layout) -> RowFields:
    """Read one row through ``layout`` (kind chat or gui); raise ``RowError`` for anything malformed."""
    if layout.kind == "gui":
        messages, uris = gui_messages(_get(row, layout, "instruction"), _get(row, layout, "steps"))
    else:
        messages, uris = _messages(_get(row, layout, "messages"), layout.fields["messages"]), []
    reward = _get(row, layout, "reward")
    success = _get(row, layout, "success")
    if layout.kind == "gui" and success is None:
        if reward is None:
            raise RowError(f"{layout.source('reward')}: a gui row needs its judged reward", "MissingLabelError")
        label = parse_number(reward, str(layout.source("reward"))) >= layout.success_threshold
    else:
        if success is None:
            raise RowError(f"{layout.source('success')}: the row has no success label", "MissingLabelError")
        label = parse_success(success, str(layout.source("success")))
    return RowFields(
        messages=messages,
        success=label,
        reward=float(label) if reward is None else parse_number(reward, str(layout.source("reward"))),
        signals=_signals(row, layout),
        task_id=_text(_get(row, layout, "task_id")),
        episode_id=_text(_get(row, layout, "episode_id")),
        model=_text(_get(row, layout, "model")),
        tools=_tools(_get(row, layout, "tools"), str(layout.source("tools"))),
        artifact_uris=uris,
    )


def gui_messages(instruction: Any, steps: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat conversation of a gui rollout, and its screenshot references.

    Each step ``{"screenshot": ref, "response": text, "observation": text?}`` becomes a user turn naming the
    screenshot (the first one preceded by the instruction) and the assistant turn ``response``.
    """
    steps = as_json(steps, "steps")
    if not isinstance(steps, list) or not steps:
        raise RowError("steps: expected a non-empty list of steps", "MalformedMessagesError")
    messages: list[dict[str, Any]] = []
    uris: list[str] = []
    for index, step in enumerate(steps):
        if not isinstance(step, Mapping) or not isinstance(step.get("response"), str):
            raise RowError(f"steps[{index}]: expected an object with a string 'response'", "MalformedMessagesError")
        screenshot = _text(step.get("screenshot"))
        lines = [str(instruction)] if index == 0 and instruction is not None else []
        if screenshot:
            lines.append(f"[screenshot: {screenshot}]")
            uris.append(screenshot)
        if step.get("observation"):
            lines.append(str(step["observation"]))
        messages.append({"role": "user", "content": "\n".join(lines)})
        messages.append({"role": "assistant", "content": step["response"]})
    return messages, uris


def _get(row: Mapping[str, Any], layout: Layout, name: str) -> Any:
    source = layout.source(name)
    return None if source is None else lookup(row, source)


def _messages(value: Any, source: str) -> list[dict[str, Any]]:
    messages = as_json(value, source)
    if hasattr(messages, "tolist"):  # numpy arrays from pandas-written files
        messages = messages.tolist()
    if not isinstance(messages, list) or not messages:
        raise RowError(f"{source}: expected a non-empty list of chat messages", "MalformedMessagesError")
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise RowError(f"{source}[{index}]: a message needs a string 'role'", "MalformedMessagesError")
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise RowError(f"{source}[{index}]: content must be a string or a list of parts", "MalformedMessagesError")
        out.append({k: v for k, v in message.items() if v is not None or k == "content"})
    if not any(m["role"] == "assistant" for m in out):
        raise RowError(f"{source}: the conversation has no assistant message", "MalformedMessagesError")
    return out


def _signals(row: Mapping[str, Any], layout: Layout) -> dict[str, float]:
    signals: dict[str, float] = {}
    source = layout.source("signals")
    value = as_json(lookup(row, source), source) if source else None
    if value is not None:
        if not isinstance(value, Mapping):
            raise RowError(f"{source}: expected an object of name -> number", "InvalidNumberError")
        signals.update({str(k): parse_number(v, f"{source}.{k}") for k, v in value.items() if v is not None})
    for name, path in layout.fields.items():
        if name.startswith(SIGNAL_PREFIX) and (number := lookup(row, path)) is not None:
            signals[name[len(SIGNAL_PREFIX) :]] = parse_number(number, path)
    return signals


def _tools(value: Any, source: str) -> list[Any]:
    tools = as_json(value, source)
    if tools is None:
        return []
    if hasattr(tools, "tolist"):
        tools = tools.tolist()
    if not isinstance(tools, list):
        raise RowError(f"{source}: expected a list of tool definitions", "MalformedMessagesError")
    return tools


def _text(value: Any) -> str | None:
    return None if value is None or value == "" else str(value)
