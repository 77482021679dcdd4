"""Orchard-SWE's task record: SWE-bench instance files load as the swebench package writes them, bad rows are named,
and the suite's diffs are real unified diffs that git and the grader's own applier both reproduce exactly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from recipes.swe.grade import apply_patch_stdlib, parse_diff
from recipes.swe.instance import (
    InstanceError,
    diff_paths,
    load_suite,
    load_suite_instance,
    load_swebench,
    snapshot,
    unified_diff,
)

ROW = {
    "repo": "octo/calc",
    "instance_id": "octo__calc-12",
    "base_commit": "0123456789abcdef0123456789abcdef01234567",
    "patch": "diff --git a/calc.py b/calc.py\n--- a/calc.py\n+++ b/calc.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n",
    "test_patch": "diff --git a/t.py b/t.py\nnew file mode 100644\n--- /dev/null\n+++ b/t.py\n@@ -0,0 +1 @@\n+y\n",
    "problem_statement": "x is wrong",
    "hints_text": "",
    "created_at": "2023-01-01T00:00:00Z",
    "version": "1.0",
    "FAIL_TO_PASS": json.dumps(["t.py::test_x"]),
    "PASS_TO_PASS": json.dumps([]),
    "environment_setup_commit": "fedcba",
}


def test_a_swebench_jsonl_file_loads_with_json_encoded_test_lists_and_unknown_fields_ignored(tmp_path: Path) -> None:
    path = tmp_path / "instances.jsonl"
    second = {**ROW, "instance_id": "octo__calc-13", "FAIL_TO_PASS": ["t.py::a", "t.py::b"], "image": "calc:13"}
    path.write_text(json.dumps(ROW) + "\n\n" + json.dumps(second) + "\n")
    first, other = load_swebench(path, split="train")
    assert (first.instance_id, first.repo, first.base_commit) == ("octo__calc-12", "octo/calc", ROW["base_commit"])
    assert (first.FAIL_TO_PASS, first.PASS_TO_PASS) == (["t.py::test_x"], [])
    assert (first.split, first.bug_kind) == ("train", None)
    assert first.patched_files() == ["calc.py"] and first.patched_files("test_patch") == ["t.py"]
    assert (other.FAIL_TO_PASS, other.image) == (["t.py::a", "t.py::b"], "calc:13")


def test_a_json_list_loads_the_same_rows(tmp_path: Path) -> None:
    path = tmp_path / "instances.json"
    path.write_text(json.dumps([ROW, {**ROW, "instance_id": "octo__calc-14"}]))
    assert [i.instance_id for i in load_swebench(path)] == ["octo__calc-12", "octo__calc-14"]


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"FAIL_TO_PASS": "not json ["}, "row 2 (octo__calc-2): field FAIL_TO_PASS"),
        ({"FAIL_TO_PASS": "[]"}, "row 2 (octo__calc-2): field FAIL_TO_PASS"),
        ({"problem_statement": None}, "row 2 (octo__calc-2): field problem_statement"),
        ({"test_patch": ""}, "row 2 (octo__calc-2): field test_patch"),
    ],
)
def test_a_bad_row_fails_naming_the_row_the_instance_and_the_field(
    tmp_path: Path, bad: dict[str, object], expected: str
) -> None:
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(ROW) + "\n" + json.dumps({**ROW, "instance_id": "octo__calc-2", **bad}) + "\n")
    with pytest.raises(InstanceError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        load_swebench(path)


def test_broken_json_a_non_object_row_and_a_repeated_id_are_named(tmp_path: Path) -> None:
    path = tmp_path / "instances.jsonl"
    path.write_text(json.dumps(ROW) + "\n{broken\n")
    with pytest.raises(InstanceError, match="row 2: invalid JSON"):
        load_swebench(path)
    path.write_text(json.dumps([ROW, 7]))
    with pytest.raises(InstanceError, match="row 2: expected a JSON object"):
        load_swebench(path.rename(tmp_path / "list.json"))
    path.write_text(json.dumps(ROW) + "\n" + json.dumps(ROW) + "\n")
    with pytest.raises(InstanceError, match="row 2: instance_id 'octo__calc-12' repeats row 1"):
        load_swebench(path)
    with pytest.raises(InstanceError, match="does not exist"):
        load_swebench(tmp_path / "missing.jsonl")


BEFORE = {
    "pkg/a.py": b"def f():\n    return 1\n\n\ndef g():\n    return 2\n",
    "pkg/gone.py": b"x = 1\n",
    "pkg/tail.py": b"a = 1\nb = 2",
    "same.txt": b"unchanged\n",
}
AFTER = {
    "pkg/a.py": b"def f():\n    return 10\n\n\ndef g():\n    return 2\n\n\ndef h():\n    return 3\n",
    "pkg/new.py": b"NEW = True\n",
    "pkg/tail.py": b"a = 1\nb = 3\n",
    "same.txt": b"unchanged\n",
}


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    """Write ``files`` (relative path -> bytes) under ``root``."""
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
    return root


def test_unified_diff_has_git_prefixes_creates_from_dev_null_and_only_lists_changed_files() -> None:
    diff = unified_diff(BEFORE, AFTER)
    assert diff_paths(diff) == ["pkg/a.py", "pkg/gone.py", "pkg/new.py", "pkg/tail.py"]
    assert "diff --git a/pkg/new.py b/pkg/new.py\nnew file mode 100644\n--- /dev/null\n+++ b/pkg/new.py\n" in diff
    assert "--- a/pkg/gone.py\n+++ /dev/null\n" in diff and "same.txt" not in diff
    assert "-b = 2\n\\ No newline at end of file\n+b = 3\n" in diff
    assert unified_diff(BEFORE, BEFORE) == ""
    assert [(old, new) for old, new, _ in parse_diff(diff)] == [
        ("pkg/a.py", "pkg/a.py"),
        ("pkg/gone.py", None),
        (None, "pkg/new.py"),
        ("pkg/tail.py", "pkg/tail.py"),
    ]


def test_git_apply_and_the_graders_stdlib_applier_both_reproduce_the_target_tree(tmp_path: Path) -> None:
    diff = unified_diff(BEFORE, AFTER)
    with_git = write_tree(tmp_path / "git", BEFORE)
    subprocess.run(["git", "apply", "-"], cwd=with_git, input=diff.encode(), check=True)  # noqa: S607
    stdlib = write_tree(tmp_path / "stdlib", BEFORE)
    apply_patch_stdlib(stdlib, diff)
    assert snapshot(with_git) == snapshot(stdlib) == AFTER


def write_suite_instance(root: Path, name: str = "calc-001", **fields: object) -> Path:
    """A minimal suite instance directory ``root/name`` (the contract's layout); ``fields`` override instance.yaml."""
    spec = {
        "instance_id": name,
        "repo": "calc",
        "split": "train",
        "bug_kind": "logic",
        "problem_statement": "total() skips the first value.",
        "FAIL_TO_PASS": ["tests/test_hidden.py::test_total"],
        "PASS_TO_PASS": [],
        **fields,
    }
    directory = root / name
    write_tree(directory / "repo", {"calc.py": b"def total(v):\n    return sum(v[1:])\n"})
    write_tree(directory / "fix", {"calc.py": b"def total(v):\n    return sum(v)\n"})
    write_tree(directory / "hidden_tests", {"tests/test_hidden.py": b"from calc import total\n"})
    (directory / "instance.yaml").write_text(yaml.safe_dump(spec))
    return directory


def test_a_suite_instance_gets_its_patch_and_test_patch_computed_from_its_folders(tmp_path: Path) -> None:
    instance = load_suite_instance(write_suite_instance(tmp_path))
    assert instance.patched_files() == ["calc.py"] and instance.patched_files("test_patch") == ["tests/test_hidden.py"]
    assert "-    return sum(v[1:])\n+    return sum(v)\n" in instance.patch
    assert "--- /dev/null\n+++ b/tests/test_hidden.py\n" in instance.test_patch
    assert (instance.split, instance.bug_kind, instance.base_commit) == ("train", "logic", None)
    write_suite_instance(tmp_path, "calc-002", split="eval")
    assert [i.instance_id for i in load_suite(tmp_path, split="eval")] == ["calc-002"]
    assert len(load_suite(tmp_path)) == 2 and load_suite(tmp_path / "nothing") == []


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"bug_kind": "typo"}, "field bug_kind"),
        ({"split": "test"}, "field split"),
        ({"FAIL_TO_PASS": []}, "field FAIL_TO_PASS"),
        ({"colour": "red"}, r"unknown field\(s\) \['colour'\]"),
        ({"patch": "x"}, "field patch is computed"),
        ({"instance_id": "calc-999"}, "differs from its directory"),
    ],
)
def test_a_bad_suite_instance_fails_naming_the_field(tmp_path: Path, fields: dict[str, object], expected: str) -> None:
    with pytest.raises(InstanceError, match=expected):
        load_suite_instance(write_suite_instance(tmp_path, "calc-001", **fields))
