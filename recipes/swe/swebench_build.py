"""Builds Orchard task directories from SWE-bench / SWE-Gym instance rows and local clones of their repositories.

``recipes.swe.build`` turns the local suite into tasks; this module does the same for rows that name a GitHub
repository (``repo``: ``owner/name``) and a ``base_commit``. Nothing is downloaded: ``--repos DIR`` holds a clone or
a ``git clone --mirror`` of every repository, as ``DIR/<owner>__<name>`` or ``DIR/<owner>/<name>`` (either with an
optional ``.git`` suffix). Layout written under ``OUT`` (the same as ``recipes.swe.build``)::

    OUT/manifest.json                   the config, each split's instance ids, the rows skipped and why
    OUT/<split>/<instance_id>/task.yaml the issue as instruction, ``python3 -I "$ORCHARD_GRADER_DIR/grade.py"``
                                        grades, limits
                             /workspace/ the repository's files at ``base_commit``, no ``.git`` and no history
                             /hidden/grade.py, instance.json

The workspace is exported from the commit's tree with a throw-away index (``git read-tree`` + ``checkout-index``):
every tracked file as ``git checkout`` writes it (``export-ignore`` attributes, which ``git archive`` obeys, do not
drop files), and no object of the repository, so no later commit (the fix) can be read from it. With
``git_snapshot`` (default on) the runtime gives the agent a fresh one-commit repository of those files.

``instance.json`` is ``recipes.swe.build.grader_instance`` (the graded ids, the row's ``test_patch``, the reference
fix's file list, the sha256 manifest of the base files as ``grade.py`` lists them, the base content of the files the
grader resets) plus ``repo``, ``base_commit`` and ``environment_setup``. ``TaskSpec`` has no place for setup
commands and the agent's workspace must not carry them, so ``environment_setup`` is recorded there only: the
instance's container image (``recipes.swe.images``, named by ``--image-template``) must already have it applied.

The grader runs pytest, so every graded id must be a pytest node id (``path.py`` or ``path.py::name``). Rows using
another runner's ids (Django's ``test_x (module.Class)``, SymPy's bare names) are refused, or skipped and listed in
``manifest.json`` with ``--skip-unsupported``.

Identical files of different instances (the same repository at nearby commits) are hard links to one copy unless
``--no-dedupe-files``: a task directory is only ever read, and SWE-Gym's thousands of checkouts would otherwise
take tens of gigabytes.

Run: ``python -m recipes.swe.swebench_build INSTANCES.jsonl --repos DIR OUT [--split eval] [--image-template T]``.
In a recipe (``recipes/swe/cluster.yaml``): ``--recipe {run_dir}/recipe.yaml --recipe-part train``, which reads
``INSTANCES``, ``--split`` and ``OUT`` from the recipe's ``tasks.train`` and every other option's default from its
``tasks:`` block (``recipes.recipe_settings``); an option given on the command line still wins.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import yaml
from pydantic import ConfigDict, Field

from orchard.logging import get_logger
from orchard.sandbox import Limits
from recipes.recipe_settings import Block, add_recipe_option, parse_with_recipe
from recipes.swe.build import BuildConfig, BuildError, grader_instance, node_file, task_yaml, write_grader
from recipes.swe.grade import working_files
from recipes.swe.instance import Split, SweInstance, load_swebench

log = get_logger("recipes.swe")
PROG = "python -m recipes.swe.swebench_build"
RECIPE_PARTS = ("train", "eval")
"""The entries of a recipe's ``tasks:`` block that ``--recipe-part`` chooses from (``tasks.train``, ``tasks.eval``)."""

__all__ = [
    "SwebenchBuildConfig",
    "UnsupportedInstanceError",
    "build_swebench",
    "export_commit",
    "find_repository",
    "main",
    "resolve_commit",
    "write_swebench_task",
]


class UnsupportedInstanceError(BuildError):
    """A row the grader cannot grade (test ids that are not pytest node ids)."""


class SwebenchBuildConfig(BuildConfig):
    """``BuildConfig``'s limits and image template, plus how rows are read and checkouts are stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    split: Split = Field("eval", description="Split of the rows that do not name theirs (SWE-bench rows do not).")  # type: ignore[assignment]
    skip_unsupported: bool = Field(
        False, description="Skip (and list in manifest.json) rows whose test ids are not pytest node ids."
    )
    dedupe_files: bool = Field(True, description="Hard-link identical files of different workspaces to one copy.")
    cpus: float = Field(2.0, gt=0, description="CPU cores of an episode (the pod's request and limit).")
    memory_mb: int = Field(8192, ge=256, description="Memory of an episode, MiB (a real project's tests need GiBs).")
    disk_mb: int = Field(16384, ge=256, description="Working copy size limit of an episode, MiB.")
    cpu_seconds: int = Field(7200, ge=60, description="CPU time of an episode's process tree (local runtime), s.")

    def limits(self) -> Limits:
        """The ``limits`` of every task's ``task.yaml``."""
        return Limits(cpus=self.cpus, memory_mb=self.memory_mb, disk_mb=self.disk_mb, cpu_seconds=self.cpu_seconds)


FilePool = dict[tuple[str, int], Path]
"""Files already written by a build, by (sha256, permission bits): the targets of hard links."""


def _git_env(home: Path) -> dict[str, str]:
    # no system or user config: a user's filters, hooks or autocrlf must not change what the workspace holds
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_TERMINAL_PROMPT": "0",
    }


def _git(
    repository: Path, args: Sequence[str], *, env: dict[str, str], what: str
) -> subprocess.CompletedProcess[bytes]:
    git = shutil.which("git")
    if git is None:
        raise BuildError("building SWE tasks needs git on PATH")
    # safe.directory: clones on a shared volume often belong to another uid; they are only read here
    argv = [git, "-C", str(repository), "-c", "core.autocrlf=false", "-c", "safe.directory=*", *args]
    done = subprocess.run(argv, env=env, capture_output=True, check=False)  # noqa: S603
    if done.returncode != 0:
        step = next(arg for arg in args if not arg.startswith("-"))
        raise BuildError(f"{what}: git {step} failed: {done.stderr.decode(errors='replace').strip()}")
    return done


def find_repository(repos: Path, instance: SweInstance) -> Path:
    """The clone of ``instance.repo`` under ``repos``; ``BuildError`` naming the instance and the paths tried."""
    owner, _, name = instance.repo.partition("/")
    if not all(re.fullmatch(r"[A-Za-z0-9_.-]+", part) and part.strip(".") for part in (owner, name)):
        raise BuildError(f"{instance.instance_id}: repo {instance.repo!r} is not 'owner/name'")
    candidates = [repos / f"{owner}__{name}", repos / owner / name]
    candidates = [path for base in candidates for path in (base, base.with_name(base.name + ".git"))]
    for path in candidates:
        if path.is_dir():
            return path
    tried = ", ".join(str(path) for path in candidates)
    raise BuildError(f"{instance.instance_id}: no clone of {instance.repo} under {repos} (tried {tried})")


def resolve_commit(repository: Path, instance: SweInstance) -> str:
    """The full id of ``instance.base_commit`` in ``repository``; ``BuildError`` naming the instance if absent."""
    if not instance.base_commit:
        raise BuildError(f"{instance.instance_id}: the row has no base_commit")
    what = f"{instance.instance_id}: base_commit {instance.base_commit} is not in {repository}"
    try:
        done = _git(
            repository,
            ["rev-parse", "--verify", f"{instance.base_commit}^{{commit}}"],
            env=_git_env(repository),
            what=what,
        )
    except BuildError:
        raise BuildError(f"{what} (fetch it: git -C {repository} fetch origin {instance.base_commit})") from None
    return done.stdout.decode().strip()


def export_commit(repository: Path, commit: str, dest: Path, *, what: str) -> None:
    """Write the files of ``commit``'s tree into ``dest`` (created), with no git directory and no history."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="orchard-swe-index-") as scratch:
        env = {**_git_env(Path(scratch)), "GIT_INDEX_FILE": str(Path(scratch) / "index")}
        _git(repository, ["read-tree", commit], env=env, what=what)
        # --work-tree also makes a bare mirror check files out; the throw-away index never touches the clone's own
        _git(repository, [f"--work-tree={dest}", "checkout-index", "--all", "--force"], env=env, what=what)


def _dedupe(workspace: Path, pool: FilePool) -> int:
    """Replace files of ``workspace`` identical to a file already in ``pool`` by hard links; returns how many."""
    linked = 0
    for directory, _, names in os.walk(workspace):
        for name in names:
            path = Path(directory, name)
            if path.is_symlink() or not path.is_file():
                continue
            key = (hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mode & 0o7777)
            first = pool.setdefault(key, path)
            if first != path:
                path.unlink()
                os.link(first, path)
                linked += 1
    return linked


def _check_supported(instance: SweInstance) -> None:
    bad = [t for t in instance.FAIL_TO_PASS + instance.PASS_TO_PASS if not node_file(t).endswith(".py")]
    if bad:
        raise UnsupportedInstanceError(
            f"{instance.instance_id}: test id {bad[0]!r} is not a pytest node id (path.py or path.py::name); "
            "the grader runs pytest only"
        )


def _base_files(workspace: Path) -> dict[str, bytes]:
    # exactly the files grade.py compares (it skips symlinks, caches, .pyc and VCS directories)
    return {path: (workspace / path).read_bytes() for path in sorted(working_files(workspace))}


def write_swebench_task(
    instance: SweInstance, repos: Path, directory: Path, config: SwebenchBuildConfig, pool: FilePool | None = None
) -> None:
    """Write the task directory of one row into ``directory``: workspace, grader, ``task.yaml``."""
    _check_supported(instance)
    repository = find_repository(repos, instance)
    commit = resolve_commit(repository, instance)
    workspace = directory / "workspace"
    export_commit(repository, commit, workspace, what=f"{instance.instance_id}: exporting {commit[:12]}")
    base = _base_files(workspace)
    try:
        record = grader_instance(instance, base, config)
    except UnicodeDecodeError as exc:
        raise BuildError(
            f"{instance.instance_id}: a file the grader resets (a test or pytest configuration) is not UTF-8: {exc}"
        ) from None
    record |= {"repo": instance.repo, "base_commit": commit, "environment_setup": instance.environment_setup}
    write_grader(directory, record)
    spec = yaml.safe_load(task_yaml(instance, config)) | {"limits": config.limits().model_dump()}
    (directory / "task.yaml").write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True), encoding="utf-8")
    if pool is not None:
        _dedupe(workspace, pool)


def build_swebench(
    instances: Path, repos: Path, out: Path, config: SwebenchBuildConfig | None = None, *, overwrite: bool = False
) -> dict[str, list[str]]:
    """Write a task directory for every row of ``instances`` under ``out/<split>/``; returns the ids by split.

    Refuses a non-empty ``out`` unless ``overwrite``. A missing clone or commit is a ``BuildError`` naming the
    instance; a row with non-pytest test ids is an ``UnsupportedInstanceError`` unless ``skip_unsupported``.
    """
    config = config or SwebenchBuildConfig()
    rows = load_swebench(instances, split=config.split)
    if not repos.is_dir():
        raise BuildError(f"repository directory {repos} does not exist")
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise BuildError(f"output directory {out} is not empty (pass overwrite=True / --overwrite)")
        shutil.rmtree(out)
    splits: dict[str, list[str]] = {"train": [], "eval": []}
    skipped: dict[str, str] = {}
    pool: FilePool | None = {} if config.dedupe_files else None
    for instance in rows:
        target = out / instance.split / instance.instance_id
        try:
            write_swebench_task(instance, repos, target, config, pool)
        except UnsupportedInstanceError as exc:
            if not config.skip_unsupported:
                raise
            shutil.rmtree(target, ignore_errors=True)
            skipped[instance.instance_id] = str(exc)
            log.warning("swe row skipped", instance=instance.instance_id, reason=str(exc))
            continue
        splits[instance.split].append(instance.instance_id)
    out.mkdir(parents=True, exist_ok=True)
    manifest = {
        "recipe": "swe",
        "instances": str(instances),
        "config": config.model_dump(),
        "splits": {split: sorted(ids) for split, ids in splits.items()},
        "skipped": skipped,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    log.info("swe tasks written", out=str(out), skipped=len(skipped), **{s: len(ids) for s, ids in splits.items()})
    return manifest["splits"]  # type: ignore[return-value]


def recipe_blocks(part: str | None) -> dict[str, Block]:
    """What ``--recipe`` reads: the ``tasks:`` block's shared settings (``repos`` and every ``SwebenchBuildConfig``
    field but ``split``), and with ``--recipe-part PART`` its entry ``PART`` (``instances``, ``split``, ``out``)."""
    shared = {"repos": "repos"} | {name: name for name in SwebenchBuildConfig.model_fields if name != "split"}
    blocks = {"tasks": Block(options=shared, recorded={"builder": "recipes.swe.swebench_build"}, nested=RECIPE_PARTS)}
    if part is not None:
        blocks[f"tasks.{part}"] = Block(options={name: name for name in ("instances", "split", "out")})
    return blocks


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("instances", type=Path, nargs="?", help="SWE-bench / SWE-Gym rows (JSONL, or a JSON list).")
    parser.add_argument("--repos", type=Path, help="Clones as DIR/owner__name or DIR/owner/name (required).")
    parser.add_argument("out", type=Path, nargs="?", help="Output directory (<split>/, manifest.json).")
    parser.add_argument("--split", choices=("train", "eval"), default=None, help="Split of rows naming none.")
    for name, field in SwebenchBuildConfig.model_fields.items():
        if name == "split":
            continue
        flag = f"--{name.replace('_', '-')}"
        if field.annotation is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=field.description)
        else:
            kind = str if field.default is None else type(field.default)
            parser.add_argument(flag, type=kind, help=field.description)
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty output directory.")
    add_recipe_option(parser, "tasks: block (its shared settings and those of --recipe-part)")
    parser.add_argument(
        "--recipe-part",
        choices=RECIPE_PARTS,
        help="The entry of tasks: giving INSTANCES, --split and OUT (relative: to the recipe's folder, the run "
        "directory for the run's own copy).",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.swe.swebench_build INSTANCES --repos DIR OUT [options]``, or
    ``--recipe RUN_DIR/recipe.yaml --recipe-part train|eval [options]`` (the cluster recipe's setup stage)."""
    parser = _parser()
    args = parse_with_recipe(parser, argv, recipe_blocks(parser.parse_known_args(argv)[0].recipe_part))
    missing = [what for what, value in (("INSTANCES", args.instances), ("--repos", args.repos), ("OUT", args.out))
               if value is None]  # fmt: skip
    if missing:
        parser.error(f"{', '.join(missing)}: required (given, or read from --recipe with --recipe-part)")
    fields = {n: getattr(args, n) for n in SwebenchBuildConfig.model_fields if getattr(args, n) is not None}
    build_swebench(args.instances, args.repos, args.out, SwebenchBuildConfig(**fields), overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
