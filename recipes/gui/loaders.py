"""Loaders of public web-agent task files (WebVoyager, Online-Mind2Web, DeepShop) into one task record.

Each reads a local file in the format its project publishes; nothing is downloaded. A malformed row fails with
``TaskFileError`` naming the file, the row (1-based line of a JSONL file, 0-based index of a JSON array) and the
field. Fields, as published:

- **WebVoyager** (``data/WebVoyager_data.jsonl`` of MinorJerry/WebVoyager): one object per line, ``web_name``
  (site name), ``id`` (``"<web_name>--<n>"``), ``ques`` (the task), ``web`` (start URL). Optional reference answers
  (``data/reference_answer.json``): ``{web_name: {"notice": str, "answers": [{"id": n, "type": "golden" |
  "possible", "ans": str}]}}``, matched by site name and the number after ``--``.
- **Online-Mind2Web** (``Online_Mind2Web.json`` of osunlp/Online-Mind2Web): a JSON array (JSONL accepted) of
  ``task_id``, ``confirmed_task`` (the task), ``website`` (start URL), ``reference_length`` (steps of a human
  demonstration), ``level`` (``easy`` | ``medium`` | ``hard``).
- **DeepShop** (``deepshop.jsonl`` of DeepShop/DeepShop): one object per line, ``id``, ``ques`` (the task),
  ``web`` (start URL; ``website`` accepted), ``web_name``, ``category``, ``difficulty``, and the query's
  ``attribute``, ``filter`` and ``sort`` requirements (``"None"``, empty or ``"**"`` when absent).

These tasks run on live websites, which cannot be reached from here (the sandbox has only loopback, and this
machine has no internet). Where they can be reached, an episode runs the same browser harness with ``start_url``
as its first page, and is graded by a judge model, since a live site's state cannot be checked: an
OpenAI-compatible endpoint given ``judge_messages(record, answer, screenshots)`` (the task, the agent's answer and
its last screenshots as image parts) answers ``SUCCESS`` or ``NOT SUCCESS`` (the WebJudge / WebVoyager protocol).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Source = Literal["webvoyager", "online_mind2web", "deepshop"]
ABSENT = ("", "none", "**")


class TaskFileError(ValueError):
    """A task file that cannot be read, or a row missing a field or holding a wrong type."""


class WebTaskRecord(BaseModel):
    """One live-web task, whatever file it came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Source
    task_id: str = Field(min_length=1)
    instruction: str = Field(min_length=1, description="The task as given to the agent.")
    start_url: str = Field(min_length=1, description="The page the browser opens first.")
    website: str = Field("", description="Site name (WebVoyager/DeepShop ``web_name``), if given.")
    level: str = Field("", description="Difficulty as published (Online-Mind2Web ``level``, DeepShop ``difficulty``).")
    reference_answer: str | None = Field(None, description="WebVoyager's reference answer, if loaded.")
    reference_type: str | None = Field(None, description="``golden`` (exact) or ``possible`` (one valid answer).")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Other published fields, as they are.")


def _rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, row) of a JSON array or a JSONL file; location is ``line N`` or ``row N``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TaskFileError(f"cannot read {path}: {exc}") from exc
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except ValueError as exc:
            raise TaskFileError(f"{path}: not valid JSON: {exc}") from exc
        yield from ((f"row {index}", row) for index, row in enumerate(rows))
        return
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield f"line {number}", json.loads(line)
            except ValueError as exc:
                raise TaskFileError(f"{path} line {number}: not valid JSON: {exc}") from exc


def _field(path: Path, where: str, row: Any, *names: str, kind: type = str, required: bool = True) -> Any:
    """The first of ``names`` present in ``row``, checked to be a ``kind``."""
    if not isinstance(row, Mapping):
        raise TaskFileError(f"{path} {where}: expected an object, got {type(row).__name__}")
    for name in names:
        if name in row and row[name] is not None:
            value = row[name]
            if kind is str and isinstance(value, int | float) and not isinstance(value, bool):
                value = str(value)
            if not isinstance(value, kind) or (kind is str and required and not value.strip()):
                raise TaskFileError(
                    f"{path} {where}: field {name!r} must be a non-empty {kind.__name__}, got {value!r}"
                )
            return value
    if required:
        raise TaskFileError(f"{path} {where}: missing field {' or '.join(repr(n) for n in names)}")
    return None


def load_webvoyager(path: Path, reference_answers: Path | None = None) -> list[WebTaskRecord]:
    """WebVoyager tasks, with reference answers when ``reference_answers`` is given."""
    answers = _webvoyager_answers(reference_answers) if reference_answers else {}
    records = []
    for where, row in _rows(path):
        task_id, site = _field(path, where, row, "id"), _field(path, where, row, "web_name")
        reference = answers.get((site, task_id.rsplit("--", 1)[-1]), {})
        records.append(WebTaskRecord(
            source="webvoyager", task_id=task_id, instruction=_field(path, where, row, "ques"),
            start_url=_field(path, where, row, "web"), website=site, reference_answer=reference.get("ans"),
            reference_type=reference.get("type"),
        ))  # fmt: skip
    return records


def _webvoyager_answers(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TaskFileError(f"cannot read reference answers {path}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise TaskFileError(f"{path}: expected an object of sites")
    out = {}
    for site, entry in data.items():
        answers = _field(path, f"site {site!r}", entry, "answers", kind=list)
        for index, answer in enumerate(answers):
            where = f"site {site!r} answer {index}"
            number = _field(path, where, answer, "id")
            out[(site, number)] = {
                "ans": _field(path, where, answer, "ans"),
                "type": _field(path, where, answer, "type"),
            }
    return out


def load_online_mind2web(path: Path) -> list[WebTaskRecord]:
    """Online-Mind2Web tasks."""
    records = []
    for where, row in _rows(path):
        length = _field(path, where, row, "reference_length", kind=int, required=False)
        records.append(WebTaskRecord(
            source="online_mind2web", task_id=_field(path, where, row, "task_id"),
            instruction=_field(path, where, row, "confirmed_task"), start_url=_field(path, where, row, "website"),
            level=_field(path, where, row, "level", required=False) or "",
            metadata={} if length is None else {"reference_length": length},
        ))  # fmt: skip
    return records


def load_deepshop(path: Path) -> list[WebTaskRecord]:
    """DeepShop tasks; ``metadata`` keeps category and the attribute, filter and sort requirements present."""
    records = []
    for where, row in _rows(path):
        extra = {
            name: row[name]
            for name in ("category", "attribute", "filter", "sort")
            if isinstance(row, Mapping) and str(row.get(name) or "").strip().lower() not in ABSENT
        }
        records.append(WebTaskRecord(
            source="deepshop", task_id=_field(path, where, row, "id"), instruction=_field(path, where, row, "ques"),
            start_url=_field(path, where, row, "web", "website"),
            website=_field(path, where, row, "web_name", required=False) or "",
            level=_field(path, where, row, "difficulty", required=False) or "", metadata=extra,
        ))  # fmt: skip
    return records


LOADERS = {"webvoyager": load_webvoyager, "online_mind2web": load_online_mind2web, "deepshop": load_deepshop}


def load_tasks(source: Source, path: Path) -> list[WebTaskRecord]:
    """The tasks of ``path`` in ``source``'s format."""
    if source not in LOADERS:
        raise TaskFileError(f"unknown task source {source!r}; known: {', '.join(LOADERS)}")
    return LOADERS[source](path)  # type: ignore[operator]


JUDGE_PROMPT = """You evaluate a web agent. Task: {task}
Start page: {url}
{reference}The agent's final answer: {answer}
The screenshots are the last pages it saw. Did it complete every requirement of the task? Reply with one line:
SUCCESS or NOT SUCCESS, then a short reason."""


def judge_messages(record: WebTaskRecord, answer: str, screenshots: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Chat messages asking a judge model whether an episode on a live site succeeded (``screenshots``: image
    URLs, ``data:`` or ``orchard-image://`` references restored by ``producers.proxy.images.restore_images``)."""
    reference = (
        f"A reference answer ({record.reference_type}): {record.reference_answer}\n" if record.reference_answer else ""
    )
    text = JUDGE_PROMPT.format(task=record.instruction, url=record.start_url, reference=reference, answer=answer)
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in screenshots]
    return [{"role": "user", "content": parts}]
