"""Episode images for the Kubernetes runtime: a Docker build context per SWE instance, and the list of image names.

Each task built with ``--image-template`` (``recipes.swe.build``, ``recipes.swe.swebench_build``) names its own
image; this module writes what builds it. The image holds what an episode pod needs and nothing of the task:

- the tools the runtime execs (``orchard/sandbox/kubernetes/commands.py``): ``/bin/sh``, coreutils (``timeout``,
  ``head``, ``cat``, ``mkdir``, ``chmod``, ``rm``), ``tar`` (the workspace upload), GNU ``find`` (``list_files``),
  ``git`` (``git_snapshot``, the grader's ``git apply``) and ``patch``;
- Python with pytest (the grade command's ``python3``), and Orchard's built-in agent (three files of the ``orchard``
  package on a ``.pth`` path, plus ``httpx``) at the interpreter path the Env runs harnesses with
  (``--harness-python``: the Env's own ``sys.executable``, ``/usr/local/bin/python`` in a ``python:3.12`` image);
- the user ``sandbox`` (uid and gid 1000, home ``/home/sandbox``: the runtime's ``run_as_user`` and ``HOME``) and
  ``safe.directory=*`` (the working copy is an emptyDir the user does not own);
- the instance's ``environment_setup``, run as root at build time by ``bash -e -o pipefail``.

Never the repository (the runtime uploads the workspace into an emptyDir at ``/workspace``), its hidden tests or
its fix: a context is built from the configuration and ``environment_setup`` alone, so instances with the same setup
get byte-identical contexts (Docker's layer cache builds them once). Written under ``OUT``::

    OUT/contexts/<instance_id>/Dockerfile, prepare.sh, environment_setup.sh (if any), orchard-harness/
    OUT/images.txt    every image name, one a line, in instance order (each once)
    OUT/images.json   instance id -> image and context; the configuration
    OUT/build.sh      docker build (and with PUSH=1, docker push) of every image

Instances whose template yields the same image share the first one's context and must have the same setup.
Run: ``python -m recipes.swe.images SOURCE OUT --image-template T`` (SOURCE: the local suite directory or a
SWE-bench / SWE-Gym instance file); then ``PUSH=1 sh OUT/build.sh``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

import orchard
from orchard.exceptions import OrchardError
from orchard.logging import get_logger
from recipes.swe.instance import SweInstance, load_suite, load_swebench

log = get_logger("recipes.swe")

HARNESS_FILES = ("__init__.py", "harnesses/__init__.py", "harnesses/builtin_agent.py")
"""The files of the ``orchard`` package ``python -m orchard.harnesses.builtin_agent`` imports (it needs only httpx)."""
HARNESS_DIR = "orchard-harness"
HARNESS_REQUIREMENT = "httpx>=0.27,<1"
RUNTIME_TOOLS = ("sh", "timeout", "head", "cat", "mkdir", "chmod", "rm", "tar", "find", "git", "patch", "python3")
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]+)?"
IMAGE_REFERENCE = re.compile(
    rf"^(?:{_HOST}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{{0,127}})?(?:@sha256:[0-9a-f]{{64}})?$"
)
"""A Docker image reference: lower-case repository path, optional registry host, tag (any case) and digest."""


class ImageError(OrchardError):
    """An image cannot be named or its context written (bad reference, conflicting instances, output in the way)."""


class ImageConfig(BaseModel):
    """How every episode image is built; each field is a command-line option."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image_template: str = Field(
        min_length=1,
        description="Image of an instance without its own `image`, as in recipes.swe.build: {instance_id} and {repo} "
        "(owner__name) are filled in, e.g. registry.local/orchard-swe:{instance_id}.",
    )
    base_image: str = Field(
        "python:3.12-slim", pattern=r"^\S+$", description="Debian or Ubuntu based image with Python 3 and pip."
    )
    harness_python: str = Field(
        "/usr/local/bin/python",
        pattern=r"^/[-A-Za-z0-9_./]+$",
        description="Interpreter path the Env runs the built-in agent with (the Env's sys.executable); "
        "linked to python3 when the base image has none there.",
    )
    harness_packages: list[str] = Field(
        default_factory=list,
        description=f"Installed for the harness interpreter besides {HARNESS_REQUIREMENT} (the built-in agent's "
        "one dependency), e.g. 'mini-swe-agent>=2.4,<3' for that harness.",
    )
    pytest: str = Field("pytest>=8,<9", min_length=1, description="Installed when the grader's python3 has none.")
    path: list[Annotated[str, Field(pattern=r"^/[-A-Za-z0-9_./]+$")]] = Field(
        default_factory=list,
        description="Directories put first on PATH after environment_setup (e.g. the conda env it creates), so the "
        "grade command's python3 is that environment's.",
    )
    uid: int = Field(1000, ge=1, description="uid and gid of the sandbox user (the runtime's run_as_user).")


def image_name(instance: SweInstance, template: str) -> str:
    """The image of ``instance``: its own ``image``, else ``template`` filled in exactly as ``recipes.swe.build``
    does; ``ImageError`` naming the instance when the result is not a valid Docker reference."""
    name = instance.image or template.format(instance_id=instance.instance_id, repo=instance.repo.replace("/", "__"))
    if not IMAGE_REFERENCE.match(name):
        raise ImageError(
            f"{instance.instance_id}: image {name!r} is not a valid Docker reference (repository paths are "
            "lower-case; put {instance_id} in the tag, e.g. registry.local/orchard-swe:{instance_id})"
        )
    return name


def setup_script(instance: SweInstance) -> str | None:
    """``environment_setup.sh``: the instance's setup commands in order (``None`` when it has none)."""
    if not instance.environment_setup:
        return None
    lines = [
        "# environment_setup of the SWE instance, run once as root while the image is built",
        *instance.environment_setup,
    ]
    return "\n".join(lines) + "\n"


def prepare_script(config: ImageConfig) -> str:
    """``prepare.sh``: harness interpreter and packages, pytest for the grader, git settings, then every check."""
    python = shlex.quote(config.harness_python)
    packages = " ".join(shlex.quote(p) for p in [HARNESS_REQUIREMENT, *config.harness_packages])
    tools = " ".join(RUNTIME_TOOLS)
    return f"""# Finishes an Orchard-SWE episode image after environment_setup, then checks what episodes rely on.
set -eu
harness_python={python}
# the Env starts the built-in agent as `$harness_python -m orchard.harnesses.builtin_agent`
if [ ! -x "$harness_python" ]; then
    mkdir -p "$(dirname "$harness_python")"
    ln -s "$(command -v python3)" "$harness_python"
fi
"$harness_python" -m pip install --no-cache-dir {packages}
site_dir=$("$harness_python" -c 'import site; print(site.getsitepackages()[0])')
mkdir -p "$site_dir" && echo /opt/{HARNESS_DIR} > "$site_dir/orchard-harness.pth"
# the grade command runs python3 -I "$ORCHARD_GRADER_DIR/grade.py", which runs pytest with that interpreter
python3 -c 'import pytest' 2>/dev/null || python3 -m pip install --no-cache-dir {shlex.quote(config.pytest)}
# the working copy is an emptyDir owned by root: git must accept it as the sandbox user
git config --system --add safe.directory '*'
for tool in {tools}; do
    command -v "$tool" >/dev/null || {{ echo "episode image: $tool is missing" >&2; exit 1; }}
done
find --version | grep -q GNU || {{ echo "episode image: find is not GNU find" >&2; exit 1; }}
"$harness_python" -m orchard.harnesses.builtin_agent --help >/dev/null
python3 -m pytest --version
"""


def dockerfile(config: ImageConfig, has_setup: bool) -> str:
    """The ``Dockerfile`` of one context (the same for every instance with the same setup)."""
    uid = config.uid
    lines = [
        "# syntax=docker/dockerfile:1",
        "# An Orchard-SWE episode image, written by recipes/swe/images.py: the Kubernetes runtime's tools, Python",
        "# with pytest, Orchard's built-in agent and the instance's environment_setup. Never the repository (the",
        "# runtime uploads the workspace), its hidden tests or its fix.",
        f"FROM {config.base_image}",
        "ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \\",
        "    PIP_BREAK_SYSTEM_PACKAGES=1 PYTHONDONTWRITEBYTECODE=1",
        "RUN apt-get update \\",
        " && apt-get install -y --no-install-recommends bash ca-certificates coreutils findutils git patch tar \\",
        " && (command -v python3 >/dev/null || apt-get install -y --no-install-recommends python3 python3-pip) \\",
        " && rm -rf /var/lib/apt/lists/*",
        # a base image may already have the uid (ubuntu:24.04 has `ubuntu`): the runtime needs only the number
        f"RUN (getent group {uid} >/dev/null || groupadd --gid {uid} sandbox) \\",
        f" && (getent passwd {uid} >/dev/null \\",
        f"     || useradd --uid {uid} --gid {uid} --home-dir /home/sandbox --create-home --shell /bin/sh sandbox)",
        f"COPY {HARNESS_DIR}/ /opt/{HARNESS_DIR}/",
    ]
    if has_setup:
        lines += [
            "COPY environment_setup.sh /opt/orchard/environment_setup.sh",
            'RUN ["/bin/bash", "-e", "-o", "pipefail", "/opt/orchard/environment_setup.sh"]',
        ]
    if config.path:
        lines.append(f"ENV PATH={':'.join(config.path)}:$PATH")
    lines += [
        "COPY prepare.sh /opt/orchard/prepare.sh",
        'RUN ["/bin/sh", "/opt/orchard/prepare.sh"]',
        "WORKDIR /workspace",
        f"USER {uid}:{uid}",
    ]
    return "\n".join(lines) + "\n"


def context_files(instance: SweInstance, config: ImageConfig) -> dict[str, bytes]:
    """Every file of the instance's build context by relative path."""
    setup = setup_script(instance)
    files = {
        "Dockerfile": dockerfile(config, setup is not None).encode(),
        "prepare.sh": prepare_script(config).encode(),
    }
    if setup is not None:
        files["environment_setup.sh"] = setup.encode()
    package = Path(orchard.__file__).resolve().parent
    for relative in HARNESS_FILES:
        files[f"{HARNESS_DIR}/orchard/{relative}"] = (package / relative).read_bytes()
    return files


def build_script(images: dict[str, str]) -> str:
    """``build.sh``: ``docker build`` of each image from its context, ``docker push`` too when ``PUSH=1``."""
    lines = [
        "#!/bin/sh",
        "# Builds every Orchard-SWE episode image (written by recipes/swe/images.py). PUSH=1 pushes each one too;",
        "# DOCKER=podman (or buildah's docker alias) uses another client.",
        "set -eu",
        'cd "$(dirname "$0")"',
        "docker_cli=${DOCKER:-docker}",
        "build() {",
        '    "$docker_cli" build --tag "$1" "contexts/$2"',
        '    if [ "${PUSH:-0}" = 1 ]; then "$docker_cli" push "$1"; fi',
        "}",
    ]
    lines += [f"build {shlex.quote(image)} {shlex.quote(context)}" for image, context in images.items()]
    return "\n".join(lines) + "\n"


def write_contexts(
    instances: Sequence[SweInstance], out: Path, config: ImageConfig, *, overwrite: bool = False
) -> dict[str, str]:
    """Write a build context per image, ``images.txt``, ``images.json`` and ``build.sh`` under ``out``.

    Returns the image of every instance (by id, in order). Refuses a non-empty ``out`` unless ``overwrite``.
    """
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise ImageError(f"output directory {out} is not empty (pass overwrite=True / --overwrite)")
        shutil.rmtree(out)
    by_instance: dict[str, str] = {}
    contexts: dict[str, tuple[str, dict[str, bytes]]] = {}  # image -> (instance id of its context, files)
    for instance in instances:
        image = image_name(instance, config.image_template)
        files = context_files(instance, config)
        owner, known = contexts.setdefault(image, (instance.instance_id, files))
        if known != files:
            raise ImageError(
                f"{instance.instance_id}: image {image} is also the image of {owner}, whose environment_setup "
                "differs; give the template {instance_id} or {repo}"
            )
        by_instance[instance.instance_id] = image
    for owner, files in contexts.values():
        for relative, data in files.items():
            target = out / "contexts" / owner / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    out.mkdir(parents=True, exist_ok=True)
    (out / "images.txt").write_text("".join(f"{image}\n" for image in contexts), encoding="utf-8")
    listing = {
        "config": config.model_dump(),
        "instances": {
            iid: {"image": image, "context": f"contexts/{contexts[image][0]}"} for iid, image in by_instance.items()
        },
    }
    (out / "images.json").write_text(json.dumps(listing, indent=1) + "\n", encoding="utf-8")
    (out / "build.sh").write_text(build_script({image: owner for image, (owner, _) in contexts.items()}))
    (out / "build.sh").chmod(0o755)
    log.info("swe image contexts written", out=str(out), instances=len(by_instance), images=len(contexts))
    return by_instance


def load_instances(source: Path) -> list[SweInstance]:
    """Every instance of ``source``: a local suite directory (both splits) or a SWE-bench / SWE-Gym file."""
    return load_suite(source) if Path(source).is_dir() else load_swebench(source)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``python -m recipes.swe.images SOURCE OUT --image-template T [options]``."""
    parser = argparse.ArgumentParser(prog="python -m recipes.swe.images", description=__doc__.split("\n")[0])
    parser.add_argument("source", type=Path, help="The local suite directory, or a SWE-bench / SWE-Gym file.")
    parser.add_argument("out", type=Path, help="Output directory (contexts/, images.txt, images.json, build.sh).")
    for name, field in ImageConfig.model_fields.items():
        flag = f"--{name.replace('_', '-')}"
        if name in ("harness_packages", "path"):
            parser.add_argument(flag, action="append", help=field.description + " Repeatable.")
        else:
            kind = int if field.annotation is int else str
            parser.add_argument(flag, type=kind, required=field.is_required(), help=field.description)
    parser.add_argument("--overwrite", action="store_true", help="Replace a non-empty output directory.")
    args = parser.parse_args(argv)
    fields = {name: getattr(args, name) for name in ImageConfig.model_fields if getattr(args, name) is not None}
    write_contexts(load_instances(args.source), args.out, ImageConfig(**fields), overwrite=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
