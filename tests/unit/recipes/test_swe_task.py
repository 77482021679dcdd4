"""Orchard-SWE tasks built from a small suite instance: nothing of the fix or the hidden tests reaches the agent's
side, the workspace is a one-commit repository, and the shipped grader keeps SWE-bench semantics (the hidden tests
are applied after the agent, agent edits to graded tests count for nothing, reward only when every test passes)."""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchard.env.tasks import TaskCatalog
from recipes.swe.build import BuildConfig, BuildError, build, reset_directories
from recipes.swe.build import main as build_main
from recipes.swe.grade import parse_reports
from recipes.swe.instance import snapshot
from tests.unit.recipes.grader_run import plant_shadow_modules, run_grader, shadow_imports

OPS = b'''"""Small numeric helpers."""


def mean(values):
    """The arithmetic mean."""
    return sum(values) / len(values)


def total(values):
    """The sum of every value."""
    return sum(values[1:])
'''
FIXED_OPS = OPS.replace(b"sum(values[1:])", b"sum(values)  # every value counts")
VISIBLE = b"""from calc.ops import mean


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_mean_of_one():
    assert mean([4]) == 4
"""
HIDDEN = b"""from calc.ops import total


def test_total_counts_the_first_value_zqx():
    assert total([5, 1]) == 6


def test_total_of_nothing_is_zero():
    assert total([]) == 0
"""
BLOB = bytes(range(256))
"""Test data that is not UTF-8."""
F2P = ["tests/test_hidden_total.py::test_total_counts_the_first_value_zqx"]
P2P = [
    "tests/test_ops.py::test_mean",
    "tests/test_ops.py::test_mean_of_one",
    "tests/test_hidden_total.py::test_total_of_nothing_is_zero",
]


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Write ``files`` (relative path -> bytes) under ``root``."""
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-instance suite in the contract's layout (plus an eval instance that is a copy with another id)."""
    root = tmp_path_factory.mktemp("suite")
    for instance_id, split in (("calc-001", "train"), ("calc-002", "eval")):
        directory = root / instance_id
        write_tree(
            directory / "repo",
            {
                "calc/__init__.py": b'"""calc."""\n',
                "calc/ops.py": OPS,
                "tests/test_ops.py": VISIBLE,
                "tests/data/blob.bin": BLOB,
                "pytest.ini": b"[pytest]\npythonpath = .\ntestpaths = tests\n",
                "README.md": b"# calc\n",
            },
        )
        write_tree(directory / "fix", {"calc/ops.py": FIXED_OPS})
        write_tree(directory / "hidden_tests", {"tests/test_hidden_total.py": HIDDEN})
        spec = {
            "instance_id": instance_id,
            "repo": "calc",
            "split": split,
            "bug_kind": "off_by_one",
            "problem_statement": "total() returns 1 for [5, 1]; it should return 6.",
            "FAIL_TO_PASS": F2P,
            "PASS_TO_PASS": P2P,
        }
        (directory / "instance.yaml").write_text(yaml.safe_dump(spec))
    return root


@pytest.fixture(scope="module")
def built(suite: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The suite built into task directories."""
    out = tmp_path_factory.mktemp("built")
    build(suite, out, overwrite=True)
    return out


def git(workspace: Path, *args: str) -> str:
    """Output of a git command in ``workspace``."""
    return subprocess.run(["git", *args], cwd=workspace, capture_output=True, check=True, text=True).stdout  # noqa: S607


def files_outside_hidden(task: Path) -> dict[str, bytes]:
    """Every file of a task directory except ``hidden/`` (git objects included, as stored)."""
    return {
        p.relative_to(task).as_posix(): p.read_bytes()
        for p in task.rglob("*")
        if p.is_file() and "hidden" not in p.relative_to(task).parts
    }


def test_every_instance_becomes_a_valid_task_under_its_split_with_the_issue_as_instruction(built: Path) -> None:
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["splits"] == {"train": ["calc-001"], "eval": ["calc-002"]}
    task = TaskCatalog(built / "train").get("calc-001")
    assert task.instruction.startswith("total() returns 1")
    assert task.grade_command == 'python3 -I "$ORCHARD_GRADER_DIR/grade.py"'
    assert sorted(p.name for p in task.hidden.iterdir()) == ["grade.py", "grade_runner.py", "instance.json"]
    assert task.git_snapshot is True and task.image is None
    assert task.labels == {"repo": "calc", "split": "train", "bug_kind": "off_by_one"}


def test_an_image_template_names_each_instance_its_own_image(suite: Path, tmp_path: Path) -> None:
    assert build_main([str(suite), str(tmp_path / "out"), "--image-template", "reg.local/swe:{instance_id}",
                       "--no-git-snapshot"]) == 0  # fmt: skip
    task = TaskCatalog(tmp_path / "out" / "eval").get("calc-002")
    assert (task.image, task.git_snapshot) == ("reg.local/swe:calc-002", False)


def test_the_workspace_is_the_base_repository_in_one_commit_with_no_other_objects(built: Path, suite: Path) -> None:
    workspace = built / "train" / "calc-001" / "workspace"
    assert git(workspace, "rev-list", "--all").count("\n") == 1
    assert git(workspace, "status", "--porcelain") == ""
    assert git(workspace, "log", "--format=%an <%ae> %s").strip() == "orchard <orchard@localhost> base"
    assert {k: v for k, v in snapshot(workspace).items()} == snapshot(suite / "calc-001" / "repo")
    reachable = set(git(workspace, "rev-list", "--all", "--objects").split())
    stored = {line for line in git(workspace, "cat-file", "--batch-all-objects", "--batch-check=%(objectname)").split()}
    assert stored <= reachable  # no dangling blob could hold a fix


def test_neither_the_fix_nor_the_hidden_tests_appear_anywhere_the_agent_can_read(built: Path) -> None:
    task = built / "train" / "calc-001"
    visible = b"\n".join(files_outside_hidden(task).values())
    workspace = task / "workspace"
    blobs = git(workspace, "grep", "-I", "-l", "", "HEAD")  # every committed text file, decompressed by git
    assert "test_hidden_total" not in blobs
    for secret in (b"every value counts", b"zqx", b"test_hidden_total", b"test_total_of_nothing_is_zero"):
        assert secret not in visible
        assert secret.decode() not in git(workspace, "grep", "-h", "-e", "", "HEAD")
    everything = b"\n".join(p.read_bytes() for p in task.rglob("*") if p.is_file())
    assert b"every value counts" not in everything  # not even in hidden/: the grader never needs the fix
    instance = json.loads((task / "hidden" / "instance.json").read_text())
    assert "patch" not in instance and instance["reference_files"] == ["calc/ops.py"]
    assert instance["restore"]["pytest.ini"] == "[pytest]\npythonpath = .\ntestpaths = tests\n"


def test_the_same_suite_builds_the_same_files_and_the_same_base_commit(
    suite: Path, built: Path, tmp_path: Path
) -> None:
    again = tmp_path / "again"
    build(suite, again, BuildConfig(split="eval"))
    assert sorted(p.name for p in again.iterdir()) == ["eval", "manifest.json"]
    ours, theirs = built / "eval" / "calc-002", again / "eval" / "calc-002"

    def tree(root: Path) -> dict[str, bytes]:
        return {k: v for k, v in snapshot(root).items() if not k.startswith("workspace/.git")}

    assert tree(ours) == tree(theirs)
    assert git(ours / "workspace", "rev-parse", "HEAD") == git(theirs / "workspace", "rev-parse", "HEAD")
    with pytest.raises(BuildError, match="not empty"):
        build(suite, again)


def working_copy(task: Path, tmp_path: Path, changes: dict[str, bytes | None]) -> Path:
    """An episode's end: the workspace (without .git, as the runtime copies it) with the agent's ``changes``
    (``None`` deletes)."""
    work = tmp_path / "work"
    shutil.copytree(task / "workspace", work, ignore=shutil.ignore_patterns(".git"))
    for name, data in changes.items():
        if data is None:
            (work / name).unlink()
        else:
            write_tree(work, {name: data})
    return work


def grade(
    task: Path, tmp_path: Path, changes: dict[str, bytes | None], *, path: str | None = None
) -> tuple[int, dict[str, float]]:
    """Run the task's grade command over a working copy with ``changes``, the grader outside it as the Env runs it;
    returns its exit status and signals."""
    run = run_grader(task, working_copy(task, tmp_path, changes), tmp_path / "grader", path=path)
    assert run.signals is not None, run.stderr
    return run.exit_code, run.signals


def test_the_unfixed_repository_fails_with_no_fail_to_pass_test_passing(built: Path, tmp_path: Path) -> None:
    code, signals = grade(built / "train" / "calc-001", tmp_path, {})
    assert code == 1
    assert signals == {
        "f2p_fraction": 0.0,
        "p2p_fraction": 1.0,
        "touched_reference_files": 0.0,
        "wrote_tests": 0.0,
        "files_changed": 0.0,
        "test_patch_applied": 1.0,
        "tampered": 0.0,
        "resolved": 0.0,
    }


def test_the_reference_fix_resolves_the_task(built: Path, tmp_path: Path) -> None:
    code, signals = grade(built / "train" / "calc-001", tmp_path, {"calc/ops.py": FIXED_OPS})
    assert code == 0
    assert (signals["resolved"], signals["f2p_fraction"], signals["p2p_fraction"]) == (1.0, 1.0, 1.0)
    assert (signals["touched_reference_files"], signals["files_changed"], signals["wrote_tests"]) == (1.0, 1.0, 0.0)


PASS_EVERYTHING = b"""import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    outcome.get_result().outcome = "passed"
"""


def test_agent_edits_to_graded_tests_and_a_planted_conftest_count_for_nothing(built: Path, tmp_path: Path) -> None:
    cheat = (
        b"def test_total_counts_the_first_value_zqx():\n    pass\n\n\ndef test_total_of_nothing_is_zero():\n    pass\n"
    )
    changes: dict[str, bytes | None] = {
        "tests/test_hidden_total.py": cheat,  # the agent guessed the hidden file and made it trivially pass
        "tests/test_ops.py": b"def test_mean():\n    pass\n",
        "conftest.py": PASS_EVERYTHING,
    }
    code, signals = grade(built / "train" / "calc-001", tmp_path, changes)
    assert code == 1
    assert (signals["f2p_fraction"], signals["p2p_fraction"], signals["wrote_tests"]) == (0.0, 1.0, 1.0)
    assert signals["files_changed"] == 3.0


def test_without_git_the_stdlib_applier_applies_the_hidden_tests(built: Path, tmp_path: Path) -> None:
    no_git = tmp_path / "bin"
    no_git.mkdir()
    code, signals = grade(built / "eval" / "calc-002", tmp_path, {"calc/ops.py": FIXED_OPS}, path=str(no_git))
    assert code == 0 and signals["test_patch_applied"] == 1.0 and signals["f2p_fraction"] == 1.0


UNFIXED = {"f2p_fraction": 0.0, "p2p_fraction": 1.0, "test_patch_applied": 1.0, "resolved": 0.0}
PLUGIN = {"cheat_plugin.py": PASS_EVERYTHING}
PYTEST_INI = b"[pytest]\npythonpath = .\ntestpaths = tests\n"
CHEATS: dict[str, dict[str, bytes | None]] = {
    "conftests": {"conftest.py": PASS_EVERYTHING, "tests/conftest.py": PASS_EVERYTHING},
    "pytest.ini addopts": {"pytest.ini": PYTEST_INI + b"addopts = -p cheat_plugin\n", **PLUGIN},
    "a pytest.ini by the tests": {"tests/pytest.ini": PYTEST_INI + b"addopts = -p cheat_plugin\n", **PLUGIN},
    "pyproject.toml": {
        "tests/pyproject.toml": b'[tool.pytest.ini_options]\naddopts = "-p cheat_plugin"\npythonpath = ["."]\n',
        **PLUGIN,
    },
    "tox.ini and setup.cfg": {
        "tests/tox.ini": b"[pytest]\naddopts = -p cheat_plugin\npythonpath = .\n",
        "calc/setup.cfg": b"[tool:pytest]\naddopts = -p cheat_plugin\n",
        **PLUGIN,
    },
    "pytest.ini deleted": {"pytest.ini": None, "tests/conftest.py": PASS_EVERYTHING},
    "start-up files": {
        "sitecustomize.py": b'import os\nos.environ["PYTEST_PLUGINS"] = "cheat_plugin"\n',
        "tests/usercustomize.py": b'import os\nos.environ["PYTEST_PLUGINS"] = "cheat_plugin"\n',
        "calc/cheat.pth": b'import os; os.environ["PYTEST_PLUGINS"] = "cheat_plugin"\n',
        **PLUGIN,
    },
}
"""Files an agent may leave to make every test pass without fixing anything."""


@pytest.mark.parametrize("cheat", list(CHEATS))
def test_planted_pytest_configuration_and_start_up_files_change_nothing(
    built: Path, tmp_path: Path, cheat: str
) -> None:
    code, signals = grade(built / "train" / "calc-001", tmp_path, CHEATS[cheat])
    assert code == 1 and {k: signals[k] for k in UNFIXED} == UNFIXED
    work = tmp_path / "work"
    kept = [n for n, data in CHEATS[cheat].items() if (work / n).is_file() and (work / n).read_bytes() == data]
    assert set(kept) <= set(PLUGIN)  # every planted configuration and start-up file removed or back to base
    assert (tmp_path / "work" / "pytest.ini").read_bytes() == PYTEST_INI  # the base file, back


def test_a_linked_conftest_and_a_linked_tests_directory_change_nothing(built: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write_tree(outside, {"test_ops.py": b"def test_mean():\n    pass\n", "conftest.py": PASS_EVERYTHING})
    work = working_copy(built / "train" / "calc-001", tmp_path, {"cheat_plugin.py": PASS_EVERYTHING})
    (work / "conftest.py").symlink_to("cheat_plugin.py")
    shutil.rmtree(work / "tests")
    (work / "tests").symlink_to(outside)
    run = run_grader(built / "train" / "calc-001", work, tmp_path / "grader")
    assert run.exit_code == 1 and run.signals is not None, run.stderr
    assert {k: run.signals[k] for k in UNFIXED} == UNFIXED
    assert not (work / "tests").is_symlink() and not (work / "conftest.py").exists()
    assert sorted(p.name for p in outside.iterdir()) == ["conftest.py", "test_ops.py"]  # written through: never


def test_a_stale_bytecode_file_of_a_fix_is_not_imported(built: Path, tmp_path: Path) -> None:
    task = built / "train" / "calc-001"
    work = working_copy(task, tmp_path, {})
    source = tmp_path / "fixed_ops.py"
    source.write_bytes(FIXED_OPS)
    cached = work / importlib.util.cache_from_source("calc/ops.py")
    py_compile.compile(str(source), cfile=str(cached), invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    probe = "import sys; sys.path.append('.'); import calc.ops; print(calc.ops.total([5, 1]))"
    sourceless = subprocess.run(  # the fix is in the .pyc only, and Python would import it
        [sys.executable, "-I", "-c", probe], cwd=work, capture_output=True, text=True, check=True
    )
    assert sourceless.stdout.strip() == "6"
    run = run_grader(task, work, tmp_path / "grader")
    assert run.exit_code == 1 and run.signals is not None, run.stderr
    assert {k: run.signals[k] for k in UNFIXED} == UNFIXED
    assert not list(work.rglob("*.pyc")) and not list(work.rglob("__pycache__"))


def test_modules_named_like_the_standard_library_or_pytest_are_never_imported(built: Path, tmp_path: Path) -> None:
    task = built / "train" / "calc-001"
    work = working_copy(task, tmp_path, {"calc/ops.py": FIXED_OPS})
    plant_shadow_modules(work)
    plant_shadow_modules(work / "tests")
    run = run_grader(task, work, tmp_path / "grader")
    assert shadow_imports(work) == []
    assert run.exit_code == 0 and run.signals is not None and run.signals["resolved"] == 1.0, run.stderr


def test_a_filter_in_the_agents_git_config_never_runs(built: Path, tmp_path: Path) -> None:
    task = built / "train" / "calc-001"
    work = working_copy(task, tmp_path, {"calc/ops.py": FIXED_OPS, ".gitattributes": b"* filter=cheat\n"})
    marker = tmp_path / "filter-ran"
    git(work, "init", "-q")
    git(work, "config", "filter.cheat.clean", f"touch {marker}; cat")
    git(work, "config", "filter.cheat.smudge", f"touch {marker}; cat")
    run = run_grader(task, work, tmp_path / "grader")
    assert "hidden test patch applied (git)" in run.stderr
    assert run.exit_code == 0 and not marker.exists(), run.stderr


def test_without_its_output_directory_the_grader_fails_naming_it(built: Path, tmp_path: Path) -> None:
    task = built / "train" / "calc-001"
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-I", str(task / "hidden" / "grade.py")],
        cwd=working_copy(task, tmp_path, {}), env={"PATH": os.environ["PATH"]}, capture_output=True, text=True,
        check=False,
    )  # fmt: skip
    assert done.returncode == 1 and "ORCHARD_GRADER_OUT is not set" in done.stderr


def test_the_directories_reset_whole_are_test_directories_that_hold_no_code_to_fix() -> None:
    base = {
        "pkg/__init__.py": b"x = 1\n", "pkg/core.py": b"", "pkg/tests/__init__.py": b"", "pkg/tests/data/a.bin": b"\0",
        "tests/test_a.py": b"", "tests/unit/test_b.py": b"", "checks/test_c.py": b"", "checks/__init__.py": b"",
        "mixed/test_d.py": b"", "mixed/helper.py": b"", "test_root.py": b"", "testing/fixtures.py": b"",
        "lib/testing/fix.py": b"",
    }  # fmt: skip
    test_files = {"checks/test_c.py", "mixed/test_d.py", "test_root.py", "new/test_e.py", "withfix/test_f.py"}
    reference = ["pkg/core.py", "withfix/impl.py", "lib/testing/fix.py"]
    assert reset_directories(base, test_files, reference) == ["checks", "new", "pkg/tests", "testing", "tests"]


def test_files_the_agent_adds_or_changes_in_a_test_directory_are_reset_before_the_run(
    built: Path, tmp_path: Path
) -> None:
    task = built / "train" / "calc-001"
    instance = json.loads((task / "hidden" / "instance.json").read_text())
    assert instance["test_dirs"] == ["tests"]
    assert instance["restore"]["tests/data/blob.bin"] == {"base64": base64.b64encode(BLOB).decode()}
    marker = tmp_path / "init-ran"
    changes: dict[str, bytes | None] = {
        "tests/__init__.py": f"open({str(marker)!r}, 'w').close()\n".encode(),  # runs when pytest collects tests/
        "tests/data/blob.bin": b"changed",
        "tests/test_ops.py": b"def test_mean():\n    pass\n",
        "tests/helper_cheat.py": PASS_EVERYTHING,
    }
    code, signals = grade(task, tmp_path, changes)
    assert code == 1 and {k: signals[k] for k in UNFIXED} == UNFIXED and signals["wrote_tests"] == 1.0
    assert not marker.exists()
    tests = tmp_path / "work" / "tests"
    assert sorted(p.relative_to(tests).as_posix() for p in tests.rglob("*") if p.is_file()) == [
        "data/blob.bin", "test_hidden_total.py", "test_ops.py"
    ]  # fmt: skip
    assert ((tests / "data" / "blob.bin").read_bytes(), (tests / "test_ops.py").read_bytes()) == (BLOB, VISIBLE)


HOOK_WRAPPER = b"""
import gc, pytest


class _Pass:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item, call):
        outcome = yield
        outcome.get_result().outcome = "passed"


for _manager in [o for o in gc.get_objects() if type(o).__name__ == "PytestPluginManager"]:
    _manager.register(_Pass())
"""
TAMPERING = {
    "a report's __init__": (
        b"""
import _pytest.reports as _reports
_init = _reports.TestReport.__init__


def _passing(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.outcome = "passed"


_reports.TestReport.__init__ = _passing
""",
        "TestReport.__init__",
    ),
    "a code object of pytest's runner": (
        b"import _pytest.runner\n_pytest.runner.show_test_item.__code__ = (lambda item: None).__code__\n",
        "_pytest.runner.show_test_item",
    ),
    "a property added to TestReport": (
        b"import _pytest.reports\n_pytest.reports.TestReport.failed = property(lambda self: False)\n",
        "TestReport gained ['failed']",
    ),
    "os.write": (b"import os\n_write = os.write\nos.write = lambda fd, data: _write(fd, data)\n", "os.write"),
    "a hook wrapper registered from the package": (HOOK_WRAPPER, "pytest_runtest_makereport implemented in"),
}
"""Code under test (the package the hidden tests import) that changes what pytest reports or how it is recorded, and
what the grader's log names as tampered with."""


@pytest.mark.parametrize("tampering", list(TAMPERING))
def test_code_under_test_that_tampers_with_pytest_fails_every_test(built: Path, tmp_path: Path, tampering: str) -> None:
    source, named = TAMPERING[tampering]
    task = built / "train" / "calc-001"
    work = working_copy(task, tmp_path, {"calc/ops.py": FIXED_OPS, "calc/__init__.py": b'"""calc."""\n' + source})
    run = run_grader(task, work, tmp_path / "grader")
    assert run.exit_code == 1 and run.signals is not None  # the fix is there: untampered, every test would pass
    assert (run.signals["tampered"], run.signals["f2p_fraction"], run.signals["p2p_fraction"]) == (1, 0, 0)
    assert run.signals["resolved"] == 0.0 and "grade: TAMPERED" in run.stderr and named in run.stderr, run.stderr


FORGED_LINES = b"""
import json, os, sys
_ids = [a for a in sys.argv if "::" in a]
_lines = [json.dumps({"event": "report", "nodeid": i, "when": "call", "outcome": "passed"}) for i in _ids]
_lines.append(json.dumps({"event": "finish", "exit": 0, "tampered": []}))
_data = "".join("%s %s\\n" % ("0" * 32, line) for line in _lines).encode()
for _fd in range(3, 64):
    try:
        os.write(_fd, b"\\n" + _data)
    except OSError:
        pass
for _path in sys.argv[1:]:
    if _path.endswith(".json"):
        open(_path, "w").write('{"exit": 0, "outcomes": {}}')
"""


def test_report_lines_without_the_runs_token_are_ignored(built: Path, tmp_path: Path) -> None:
    init = b'"""calc."""\n' + FORGED_LINES
    code, signals = grade(built / "train" / "calc-001", tmp_path, {"calc/__init__.py": init})
    assert code == 1 and {k: signals[k] for k in UNFIXED} == UNFIXED and signals["tampered"] == 0.0


def test_an_expected_failure_raised_by_the_code_under_test_does_not_pass(built: Path, tmp_path: Path) -> None:
    xfail = OPS.replace(b"    return sum(values[1:])", b"    import pytest\n\n    pytest.xfail('later')")
    code, signals = grade(built / "train" / "calc-001", tmp_path, {"calc/ops.py": xfail})
    assert code == 1 and (signals["f2p_fraction"], signals["p2p_fraction"]) == (0.0, round(2 / 3, 6))


def test_only_a_finished_runs_lines_with_its_token_count() -> None:
    token = "t" * 32

    def line(record: dict[str, object], prefix: str = token) -> bytes:
        return f"{prefix} {json.dumps(record)}\n".encode()

    def report(node: str, when: str, outcome: str, **extra: bool) -> dict[str, object]:
        return {"event": "report", "nodeid": node, "when": when, "outcome": outcome, **extra}

    finish = line({"event": "finish", "exit": 1, "tampered": []})
    reports = [
        line(report("a", "call", "passed")),
        line(report("b", "call", "failed")),
        line(report("b", "call", "passed"), prefix="x" * 32),  # forged: another token
        line(report("c", "call", "skipped", xfail=True)),  # pytest.xfail() with no marker: not passing
        line(report("d", "call", "skipped", xfail=True, marked=True)),
        line(report("e", "call", "passed")),
        line(report("e", "teardown", "failed")),
    ]
    run = parse_reports(b"".join(reports) + b"garbage\n" + finish, token)
    assert run == ({"a": "passed", "b": "failed", "c": "skipped", "d": "passed", "e": "failed"}, True, [])
    assert parse_reports(b"".join(reports), token) == ({}, False, [])  # no finish line: the run counts for nothing
    assert parse_reports(finish + finish, token).tampered == ["more than one finish line"]


def test_signals_forged_and_locked_in_the_output_directory_are_replaced(built: Path, tmp_path: Path) -> None:
    out = tmp_path / "grader" / "grader-out"  # where run_grader puts $ORCHARD_GRADER_OUT (the runner never sees it)
    lock = f"""
import os
_out = {str(out)!r}
os.makedirs(os.path.join(_out, "signals.json", "deep"), exist_ok=True)
os.chmod(os.path.join(_out, "signals.json"), 0o555)
os.chmod(_out, 0o555)
"""
    code, signals = grade(built / "train" / "calc-001", tmp_path, {"calc/__init__.py": lock.encode()})
    assert code == 1 and {k: signals[k] for k in UNFIXED} == UNFIXED


def test_in_a_pid_namespace_of_its_own_the_grader_kills_every_process_but_its_ancestors(built: Path) -> None:
    unshare = shutil.which("unshare")
    namespace = [unshare or "unshare", "--pid", "--fork", "--mount-proc"]
    if unshare is None or subprocess.run([*namespace, "true"], capture_output=True, check=False).returncode != 0:  # noqa: S603
        pytest.skip("no PID namespaces here")
    script = 'setsid sh -c "sleep 300 & sleep 300" </dev/null >/dev/null 2>&1 & sleep 0.3; exec "$1" -I -c "$2" "$3"'
    probe = "import sys; sys.path.insert(0, sys.argv[1]); import grade; print(grade.kill_strays(), grade.kill_strays())"
    hidden = str(built / "train" / "calc-001" / "hidden")
    env = {"PATH": os.environ["PATH"], "ORCHARD_GRADER_DIR": "/orchard/grader"}  # the namespaced runtime's path
    done = subprocess.run(  # noqa: S603
        [*namespace, "sh", "-c", script, "sh", sys.executable, probe, hidden], env=env, capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    first, second = map(int, done.stdout.split())
    assert first >= 2 and second == 0, done.stdout  # the daemons, setsid or not; then nothing left but itself
