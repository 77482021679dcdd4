"""SWE-bench rows built into Orchard tasks from a local clone: the workspace is the base commit's files with no git
history, the grader holds the row's hidden tests, the unfixed repository fails and the row's own patch resolves it;
a missing clone or commit, and test ids the pytest grader cannot run, fail naming the instance."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from orchard.env.tasks import TaskCatalog
from recipes.swe.build import BuildError
from recipes.swe.grade import apply_patch
from recipes.swe.swebench_build import SwebenchBuildConfig, UnsupportedInstanceError, build_swebench, main
from tests.unit.recipes import grader_run

OPS = '''"""Small numeric helpers."""


def mean(values):
    """The arithmetic mean."""
    return sum(values) / len(values)


def total(values):
    """The sum of every value."""
    return sum(values[1:])
'''
VISIBLE = """from calc.ops import mean


def test_mean():
    assert mean([1, 2, 3]) == 2
"""
HIDDEN = """from calc.ops import total


def test_total_counts_the_first_value_zqx():
    assert total([5, 1]) == 6
"""
FIX_MARK = "every value counts"
F2P = ["tests/test_hidden_total.py::test_total_counts_the_first_value_zqx"]
P2P = ["tests/test_ops.py::test_mean"]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "dev",
    "GIT_AUTHOR_EMAIL": "dev@example.com",
    "GIT_COMMITTER_NAME": "dev",
    "GIT_COMMITTER_EMAIL": "dev@example.com",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
}


def git(cwd: Path, *args: str) -> str:
    """Output of a git command in ``cwd``."""
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, check=True, text=True).stdout


def write(root: Path, files: dict[str, str]) -> None:
    """Write text files under ``root``."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)


class Upstream:
    """A repository with two commits: the base (the bug) and the fix with its test, like a merged pull request."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True)
        git(root, "init", "-q", "--initial-branch=main")
        write(
            root,
            {
                "calc/__init__.py": '"""calc."""\n',
                "calc/ops.py": OPS,
                "tests/test_ops.py": VISIBLE,
                "pytest.ini": "[pytest]\npythonpath = .\ntestpaths = tests\n",
                "README.md": "# calc\n",
                "NOTES.txt": "kept although .gitattributes marks it export-ignore\n",
                ".gitattributes": "NOTES.txt export-ignore\n",
            },
        )
        (root / "readme-link").symlink_to("README.md")
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "base")
        self.base = git(root, "rev-parse", "HEAD").strip()
        write(root, {"calc/ops.py": OPS.replace("sum(values[1:])", f"sum(values)  # {FIX_MARK}")})
        write(root, {"tests/test_hidden_total.py": HIDDEN})
        git(root, "add", "-A")
        git(root, "commit", "-q", "-m", "fix total")
        self.fix = git(root, "rev-parse", "HEAD").strip()
        self.patch = git(root, "diff", self.base, self.fix, "--", "calc")
        self.test_patch = git(root, "diff", self.base, self.fix, "--", "tests")

    def row(self, instance_id: str = "octo__calc-1", **fields: object) -> dict[str, object]:
        """A SWE-bench row (its test id lists JSON-encoded, as swebench writes them) at the base commit."""
        row: dict[str, object] = {
            "instance_id": instance_id,
            "repo": "octo/calc",
            "base_commit": self.base,
            "problem_statement": "total() returns 1 for [5, 1]; it should return 6.",
            "FAIL_TO_PASS": json.dumps(F2P),
            "PASS_TO_PASS": json.dumps(P2P),
            "test_patch": self.test_patch,
            "patch": self.patch,
            "environment_setup": "pip install numpy==1.26.4",
            "version": "1.0",
            "created_at": "2024-01-01T00:00:00Z",
        }
        return row | fields


def write_rows(path: Path, rows: list[dict[str, object]]) -> Path:
    """A JSONL instance file."""
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> Upstream:
    """The upstream repository."""
    return Upstream(tmp_path_factory.mktemp("upstream") / "calc")


@pytest.fixture(scope="module")
def repos(upstream: Upstream, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository directory holding a plain clone as owner__name."""
    root = tmp_path_factory.mktemp("repos")
    git(root, "clone", "-q", str(upstream.root), "octo__calc")
    return root


@pytest.fixture(scope="module")
def built(upstream: Upstream, repos: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One row built into tasks with an image template."""
    work = tmp_path_factory.mktemp("built")
    rows = write_rows(work / "instances.jsonl", [upstream.row()])
    config = SwebenchBuildConfig(image_template="reg.local/swe:{instance_id}")
    assert build_swebench(rows, repos, work / "out", config) == {"train": [], "eval": ["octo__calc-1"]}
    return work / "out"


def tree_at(repo: Path, commit: str) -> dict[str, bytes]:
    """Every regular file of ``commit`` (symlinks left out), as git stores it."""
    listing = git(repo, "ls-tree", "-r", commit).splitlines()
    files = {}
    for line in listing:
        meta, path = line.split("\t", 1)
        mode, _, sha = meta.split()
        if mode != "120000":
            files[path] = subprocess.run(
                ["git", "cat-file", "blob", sha], cwd=repo, capture_output=True, check=True
            ).stdout  # noqa: S607
    return files


def regular_files(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` by relative path."""
    return {
        p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file() and not p.is_symlink()
    }


def test_the_workspace_is_the_base_commits_files_with_no_git_directory(built: Path, upstream: Upstream) -> None:
    workspace = built / "eval" / "octo__calc-1" / "workspace"
    assert not any(part == ".git" for p in workspace.rglob("*") for part in p.relative_to(workspace).parts)
    assert regular_files(workspace) == tree_at(upstream.root, upstream.base)
    assert (workspace / "NOTES.txt").is_file()  # export-ignore does not drop files, unlike git archive
    assert os.readlink(workspace / "readme-link") == "README.md"
    assert "sum(values[1:])" in (workspace / "calc" / "ops.py").read_text()


def test_the_task_names_its_image_and_labels_and_keeps_fix_and_hidden_tests_out_of_reach(
    built: Path, upstream: Upstream
) -> None:
    task = TaskCatalog(built / "eval").get("octo__calc-1")
    assert task.instruction.startswith("total() returns 1")
    assert (task.image, task.git_snapshot, task.grade_command) == (
        "reg.local/swe:octo__calc-1",
        True,
        'python3 -I "$ORCHARD_GRADER_DIR/grade.py"',
    )
    assert task.labels == {"repo": "octo/calc", "split": "eval"}
    assert (task.limits.cpus, task.limits.memory_mb, task.limits.disk_mb) == (2.0, 8192, 16384)
    outside_hidden = b"".join(
        p.read_bytes() for p in task.directory.rglob("*") if p.is_file() and "hidden" not in p.parts
    )
    for secret in (FIX_MARK, "zqx", "test_hidden_total", "pip install numpy"):
        assert secret.encode() not in outside_hidden
    everything = b"".join(p.read_bytes() for p in task.directory.rglob("*") if p.is_file())
    assert FIX_MARK.encode() not in everything  # the grader needs the fix's file list only


def test_the_grader_record_holds_the_rows_hidden_tests_and_environment_setup(built: Path, upstream: Upstream) -> None:
    record = json.loads((built / "eval" / "octo__calc-1" / "hidden" / "instance.json").read_text())
    assert (record["FAIL_TO_PASS"], record["PASS_TO_PASS"]) == (F2P, P2P)
    assert record["test_patch"] == upstream.test_patch
    assert (record["repo"], record["base_commit"]) == ("octo/calc", upstream.base)
    assert record["environment_setup"] == ["pip install numpy==1.26.4"]
    assert record["reference_files"] == ["calc/ops.py"]
    assert "readme-link" not in record["base_files"] and "NOTES.txt" in record["base_files"]
    manifest = json.loads((built / "manifest.json").read_text())
    assert manifest["splits"] == {"train": [], "eval": ["octo__calc-1"]} and manifest["skipped"] == {}


def run_grader(task: Path, tmp_path: Path, patch: str | None) -> tuple[int, dict[str, float]]:
    """An episode's end: copy the workspace, apply ``patch`` (the agent's work), grade from outside it."""
    work = tmp_path / "work"
    shutil.copytree(task / "workspace", work, symlinks=True)
    if patch is not None:
        apply_patch(work, patch)
    run = grader_run.run_grader(task, work, tmp_path / "grader")
    assert run.signals is not None, run.stderr
    return run.exit_code, run.signals


def test_the_unfixed_repository_fails_with_the_hidden_tests_applied(built: Path, tmp_path: Path) -> None:
    code, signals = run_grader(built / "eval" / "octo__calc-1", tmp_path, None)
    assert code == 1
    assert (signals["test_patch_applied"], signals["f2p_fraction"], signals["p2p_fraction"]) == (1.0, 0.0, 1.0)
    assert signals["resolved"] == 0.0


def test_the_rows_reference_patch_resolves_the_task(built: Path, upstream: Upstream, tmp_path: Path) -> None:
    code, signals = run_grader(built / "eval" / "octo__calc-1", tmp_path, upstream.patch)
    assert code == 0
    assert (signals["resolved"], signals["f2p_fraction"], signals["p2p_fraction"]) == (1.0, 1.0, 1.0)
    assert (signals["touched_reference_files"], signals["files_changed"]) == (1.0, 1.0)


def test_a_missing_clone_is_an_error_naming_the_instance_and_the_paths_tried(
    upstream: Upstream, tmp_path: Path
) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", [upstream.row(repo="octo/absent")])
    (tmp_path / "repos").mkdir()
    with pytest.raises(BuildError, match=r"octo__calc-1: no clone of octo/absent under .*octo__absent"):
        build_swebench(rows, tmp_path / "repos", tmp_path / "out")
    rows = write_rows(tmp_path / "rows.jsonl", [upstream.row(repo="../calc")])
    with pytest.raises(BuildError, match=r"octo__calc-1: repo '../calc' is not 'owner/name'"):
        build_swebench(rows, tmp_path / "repos", tmp_path / "out")


def test_a_missing_base_commit_is_an_error_naming_the_instance_and_the_commit(
    upstream: Upstream, repos: Path, tmp_path: Path
) -> None:
    absent = "0123456789abcdef0123456789abcdef01234567"
    rows = write_rows(tmp_path / "rows.jsonl", [upstream.row("octo__calc-9", base_commit=absent)])
    with pytest.raises(BuildError, match=f"octo__calc-9: base_commit {absent} is not in .*octo__calc.*fetch"):
        build_swebench(rows, repos, tmp_path / "out")


def test_test_ids_of_another_runner_are_refused_or_skipped_and_listed(
    upstream: Upstream, repos: Path, tmp_path: Path
) -> None:
    django_style = upstream.row("octo__calc-2", FAIL_TO_PASS=["test_total (calc.tests.TotalTests)"])
    rows = write_rows(tmp_path / "rows.jsonl", [upstream.row(), django_style])
    with pytest.raises(UnsupportedInstanceError, match="octo__calc-2: test id 'test_total .*' is not a pytest node"):
        build_swebench(rows, repos, tmp_path / "out")
    config = SwebenchBuildConfig(skip_unsupported=True)
    assert build_swebench(rows, repos, tmp_path / "out", config, overwrite=True)["eval"] == ["octo__calc-1"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert list(manifest["skipped"]) == ["octo__calc-2"]
    assert not (tmp_path / "out" / "eval" / "octo__calc-2").exists()


def test_a_bare_mirror_as_owner_slash_name_works_and_identical_files_are_stored_once(
    upstream: Upstream, tmp_path: Path
) -> None:
    repos = tmp_path / "repos"
    (repos / "octo").mkdir(parents=True)
    git(repos / "octo", "clone", "-q", "--mirror", str(upstream.root), "calc.git")
    rows = write_rows(tmp_path / "rows.jsonl", [upstream.row(), upstream.row("octo__calc-2", base_commit=upstream.fix)])
    argv = [str(rows), "--repos", str(repos), str(tmp_path / "out"), "--split", "train", "--memory-mb", "4096"]
    assert main(argv) == 0
    first, second = (tmp_path / "out" / "train" / name / "workspace" for name in ("octo__calc-1", "octo__calc-2"))
    assert regular_files(second) == tree_at(upstream.root, upstream.fix)
    assert (first / "README.md").stat().st_ino == (second / "README.md").stat().st_ino
    assert (first / "calc" / "ops.py").read_text() != (second / "calc" / "ops.py").read_text()
    task = yaml.safe_load((tmp_path / "out" / "train" / "octo__calc-1" / "task.yaml").read_text())
    assert task["labels"] == {"repo": "octo/calc", "split": "train"} and "image" not in task
    assert task["limits"]["memory_mb"] == 4096


def test_without_dedupe_every_workspace_has_its_own_files(upstream: Upstream, repos: Path, tmp_path: Path) -> None:
    rows = write_rows(tmp_path / "rows.jsonl", [upstream.row(), upstream.row("octo__calc-2")])
    build_swebench(rows, repos, tmp_path / "out", SwebenchBuildConfig(dedupe_files=False))
    first, second = (tmp_path / "out" / "eval" / name / "workspace" for name in ("octo__calc-1", "octo__calc-2"))
    assert (first / "README.md").stat().st_ino != (second / "README.md").stat().st_ino
    with pytest.raises(BuildError, match="not empty"):
        build_swebench(rows, repos, tmp_path / "out")
