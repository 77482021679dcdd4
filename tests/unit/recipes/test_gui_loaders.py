"""Loaders of WebVoyager, Online-Mind2Web and DeepShop task files (fixtures written here, in the published formats)
into task records; malformed rows fail naming the file, row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from recipes.gui.loaders import TaskFileError, WebTaskRecord, judge_messages, load_tasks, load_webvoyager


def jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + "\n")
    return path


def test_webvoyager_rows_and_reference_answers_become_records(tmp_path: Path) -> None:
    tasks = jsonl(tmp_path / "WebVoyager_data.jsonl", [
        {"web_name": "Allrecipes", "id": "Allrecipes--0", "ques": "Find a lasagna recipe.", "web": "https://www.allrecipes.com/"},
        {"web_name": "Allrecipes", "id": "Allrecipes--1", "ques": "Find a soup.", "web": "https://www.allrecipes.com/"},
    ])  # fmt: skip
    answers = tmp_path / "reference_answer.json"
    answers.write_text(
        json.dumps({"Allrecipes": {"notice": "", "answers": [{"id": 0, "type": "possible", "ans": "X"}]}})
    )
    first, second = load_webvoyager(tasks, answers)
    assert first == WebTaskRecord(
        source="webvoyager", task_id="Allrecipes--0", instruction="Find a lasagna recipe.",
        start_url="https://www.allrecipes.com/", website="Allrecipes", reference_answer="X", reference_type="possible",
    )  # fmt: skip
    assert (second.reference_answer, second.reference_type) == (None, None)


def test_online_mind2web_json_arrays_and_deepshop_lines_become_records(tmp_path: Path) -> None:
    mind2web = tmp_path / "Online_Mind2Web.json"
    row = {"task_id": "fb7b", "confirmed_task": "Find a flight.", "website": "https://www.united.com/"}
    mind2web.write_text(json.dumps([{**row, "reference_length": 7, "level": "medium"}]))
    [record] = load_tasks("online_mind2web", mind2web)
    assert (record.task_id, record.start_url, record.level, record.metadata) == (
        "fb7b", "https://www.united.com/", "medium", {"reference_length": 7},
    )  # fmt: skip
    deepshop = jsonl(tmp_path / "deepshop.jsonl", [
        {"id": 3, "ques": "Buy a red kettle under $30.", "web": "https://www.amazon.com/", "web_name": "Amazon",
         "category": "home", "difficulty": "easy", "attribute": "red", "filter": "under $30", "sort": "None"},
    ])  # fmt: skip
    [shop] = load_tasks("deepshop", deepshop)
    assert (shop.task_id, shop.level, shop.website) == ("3", "easy", "Amazon")
    assert shop.metadata == {"category": "home", "attribute": "red", "filter": "under $30"}


@pytest.mark.parametrize(
    ("source", "content", "message"),
    [
        ("webvoyager", '{"id": "A--0", "ques": "q", "web": "https://a"}\n', r"line 1: missing field 'web_name'"),
        ("deepshop", '{"id": "1", "ques": "q", "web": ""}\n', r"line 1: field 'web' must be a non-empty str"),
        ("online_mind2web", '[{"task_id": "t", "confirmed_task": "q", "website": "w"}, 5]',
         r"row 1: expected an object"),
        ("online_mind2web", '[{"task_id": "t", "confirmed_task": "q", "website": "w", "reference_length": "x"}]',
         r"row 0: field 'reference_length' must be a non-empty int"),
        ("webvoyager", "{not json}\n", r"line 1: not valid JSON"),
    ],
)  # fmt: skip
def test_a_bad_row_is_refused_naming_its_row_and_field(tmp_path: Path, source: str, content: str, message: str) -> None:
    path = tmp_path / "tasks.json"
    path.write_text(content)
    with pytest.raises(TaskFileError, match=message):
        load_tasks(source, path)  # type: ignore[arg-type]


def test_the_judge_gets_the_task_the_answer_and_the_screenshots() -> None:
    record = WebTaskRecord(source="deepshop", task_id="1", instruction="Buy a kettle.", start_url="https://shop")
    [message] = judge_messages(record, "Added it.", ["data:image/png;base64,aGk="])
    text, image = message["content"]
    assert "Buy a kettle." in text["text"] and "Added it." in text["text"] and "SUCCESS or NOT SUCCESS" in text["text"]
    assert image == {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk="}}
