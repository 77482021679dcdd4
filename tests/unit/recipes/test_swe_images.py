"""Episode image build contexts: what the Kubernetes runtime and the grader need plus the instance's environment
setup, never the repository, its hidden tests or its fix; image names exactly those the built tasks ask for.
No Docker engine runs here: the contexts' content is checked, and their scripts parsed by the shells."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from recipes.swe.build import SUITE_DIR, BuildConfig, task_yaml
from recipes.swe.images import RUNTIME_TOOLS, ImageConfig, ImageError, image_name, main, write_contexts
from recipes.swe.instance import SweInstance, load_suite

TEMPLATE = "reg.local/orchard-swe:{instance_id}"
TEST_PATCH = """diff --git a/tests/test_hidden_total.py b/tests/test_hidden_total.py
new file mode 100644
--- /dev/null
+++ b/tests/test_hidden_total.py
@@ -0,0 +1,2 @@
+def test_total_counts_the_first_value_zqx():
+    assert __import__("calc.ops").ops.total([5, 1]) == 6
"""
PATCH = """diff --git a/calc/ops.py b/calc/ops.py
--- a/calc/ops.py
+++ b/calc/ops.py
@@ -1,2 +1,2 @@
 def total(values):
-    return sum(values[1:])
+    return sum(values)  # every value counts
"""
SETUP = ["apt-get update && apt-get install -y --no-install-recommends libxml2-dev", "pip install 'numpy==1.26.4'"]


def row(instance_id: str = "octo__calc-1", **fields: object) -> SweInstance:
    """A SWE-bench style instance with an environment setup."""
    values: dict[str, object] = {
        "instance_id": instance_id,
        "repo": "octo/calc",
        "base_commit": "a" * 40,
        "problem_statement": "total() returns 1 for [5, 1]; it should return 6.",
        "FAIL_TO_PASS": ["tests/test_hidden_total.py::test_total_counts_the_first_value_zqx"],
        "PASS_TO_PASS": ["tests/test_ops.py::test_mean"],
        "test_patch": TEST_PATCH,
        "patch": PATCH,
        "environment_setup": SETUP,
    }
    return SweInstance(**(values | fields))


def context(out: Path, instance_id: str) -> dict[str, bytes]:
    """Every file of one written context."""
    root = out / "contexts" / instance_id
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Contexts of two rows with the default configuration."""
    out = tmp_path_factory.mktemp("images")
    write_contexts([row(), row("octo__calc-2", environment_setup=[])], out, ImageConfig(image_template=TEMPLATE))
    return out


def test_a_context_installs_the_runtimes_tools_python_with_pytest_and_the_harness(written: Path) -> None:
    files = context(written, "octo__calc-1")
    assert sorted(files) == [
        "Dockerfile",
        "environment_setup.sh",
        "orchard-harness/orchard/__init__.py",
        "orchard-harness/orchard/harnesses/__init__.py",
        "orchard-harness/orchard/harnesses/builtin_agent.py",
        "prepare.sh",
    ]
    docker = files["Dockerfile"].decode()
    assert "\nFROM python:3.12-slim\n" in docker
    assert "apt-get install -y --no-install-recommends bash ca-certificates coreutils findutils git patch tar" in docker
    assert "useradd --uid 1000 --gid 1000 --home-dir /home/sandbox" in docker
    assert docker.endswith("WORKDIR /workspace\nUSER 1000:1000\n")
    prepare = files["prepare.sh"].decode()
    assert "harness_python=/usr/local/bin/python\n" in prepare
    assert "\"$harness_python\" -m pip install --no-cache-dir 'httpx>=0.27,<1'\n" in prepare
    assert "python3 -c 'import pytest' 2>/dev/null || python3 -m pip install --no-cache-dir 'pytest>=8,<9'" in prepare
    assert "git config --system --add safe.directory '*'" in prepare
    assert f"for tool in {' '.join(RUNTIME_TOOLS)}; do" in prepare
    assert {"tar", "find", "git", "patch", "timeout", "head"} <= set(RUNTIME_TOOLS)


def test_the_environment_setup_runs_as_a_script_before_the_checks(written: Path) -> None:
    files = context(written, "octo__calc-1")
    setup = files["environment_setup.sh"].decode()
    assert setup.splitlines()[1:] == SETUP
    docker = files["Dockerfile"].decode()
    run_setup = 'RUN ["/bin/bash", "-e", "-o", "pipefail", "/opt/orchard/environment_setup.sh"]'
    assert docker.index(run_setup) < docker.index('RUN ["/bin/sh", "/opt/orchard/prepare.sh"]')
    without = context(written, "octo__calc-2")
    assert "environment_setup.sh" not in without and "environment_setup.sh" not in without["Dockerfile"].decode()


def test_no_context_holds_the_repository_its_hidden_tests_or_its_fix(written: Path) -> None:
    everything = b"\n".join(p.read_bytes() for p in written.rglob("*") if p.is_file())
    for secret in ("zqx", "test_hidden_total", "every value counts", "sum(values", "calc/ops.py", "total() returns"):
        assert secret.encode() not in everything
    assert not any(p.name in {"workspace", "hidden", ".grader", ".git"} for p in written.rglob("*"))


def test_the_scripts_parse_and_the_copied_harness_files_run_the_builtin_agent(written: Path, tmp_path: Path) -> None:
    root = written / "contexts" / "octo__calc-1"
    for shell, script in (
        ("sh", root / "prepare.sh"),
        ("bash", root / "environment_setup.sh"),
        ("sh", written / "build.sh"),
    ):
        assert subprocess.run([shell, "-n", str(script)], capture_output=True, check=False).returncode == 0
    harness = root / "orchard-harness"
    site = str(Path(httpx.__file__).resolve().parents[1])  # httpx only: no site, no installed orchard
    code = (
        "import runpy, sys; sys.path[:0] = sys.argv[1:3]; sys.argv = ['builtin_agent', '--help'];"
        "import orchard; assert orchard.__file__.startswith(sys.path[0]), orchard.__file__;"
        "runpy.run_module('orchard.harnesses.builtin_agent', run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-S", "-c", code, str(harness), site], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--base-url" in done.stdout


def test_image_names_are_those_the_built_tasks_ask_for(tmp_path: Path) -> None:
    suite = load_suite(SUITE_DIR)
    rows = [row(), row("octo__calc-2", image="reg.local/custom/calc:2")]
    images = write_contexts([*suite, *rows], tmp_path / "out", ImageConfig(image_template=TEMPLATE))
    for instance in [*suite, *rows]:
        task = yaml.safe_load(task_yaml(instance, BuildConfig(image_template=TEMPLATE)))
        assert images[instance.instance_id] == task["image"]
    assert images["octo__calc-2"] == "reg.local/custom/calc:2"
    listed = (tmp_path / "out" / "images.txt").read_text().splitlines()
    assert listed == list(images.values())
    manifest = json.loads((tmp_path / "out" / "images.json").read_text())
    assert manifest["instances"]["roman-001"] == {
        "image": "reg.local/orchard-swe:roman-001",
        "context": "contexts/roman-001",
    }
    build = (tmp_path / "out" / "build.sh").read_text()
    assert "build reg.local/orchard-swe:roman-001 roman-001\n" in build
    assert '"$docker_cli" build --tag "$1" "contexts/$2"' in build and '"$docker_cli" push "$1"' in build


def test_instances_sharing_an_image_share_one_context_unless_their_setups_differ(tmp_path: Path) -> None:
    suite = load_suite(SUITE_DIR)[:3]
    images = write_contexts(suite, tmp_path / "shared", ImageConfig(image_template="reg.local/orchard-swe:stdlib"))
    assert set(images.values()) == {"reg.local/orchard-swe:stdlib"}
    assert (tmp_path / "shared" / "images.txt").read_text() == "reg.local/orchard-swe:stdlib\n"
    assert [p.name for p in (tmp_path / "shared" / "contexts").iterdir()] == [suite[0].instance_id]
    clash = [row(), row("octo__calc-2", environment_setup=["pip install other"])]
    with pytest.raises(
        ImageError, match="octo__calc-2: image reg.local/swe:octo__calc is also the image of octo__calc-1"
    ):
        write_contexts(clash, tmp_path / "clash", ImageConfig(image_template="reg.local/swe:{repo}"))


def test_a_name_that_is_no_docker_reference_is_an_error_naming_the_instance() -> None:
    gym = row("Project-MONAI__MONAI-1", repo="Project-MONAI/MONAI")
    assert image_name(gym, TEMPLATE) == "reg.local/orchard-swe:Project-MONAI__MONAI-1"  # a tag may hold capitals
    with pytest.raises(ImageError, match=r"Project-MONAI__MONAI-1: image 'reg.local/Project-MONAI__MONAI:latest'"):
        image_name(gym, "reg.local/{repo}:latest")


def test_options_set_the_base_image_harness_interpreter_packages_and_path(tmp_path: Path) -> None:
    suite_dir = tmp_path / "suite"
    shutil.copytree(SUITE_DIR / "roman-001", suite_dir / "roman-001")
    argv = [str(suite_dir), str(tmp_path / "out"), "--image-template", TEMPLATE, "--base-image", "ubuntu:24.04",
            "--harness-python", "/opt/venv/bin/python", "--harness-packages", "mini-swe-agent>=2.4,<3",
            "--path", "/opt/conda/envs/testbed/bin", "--uid", "2000"]  # fmt: skip
    assert main(argv) == 0
    files = context(tmp_path / "out", "roman-001")
    docker, prepare = files["Dockerfile"].decode(), files["prepare.sh"].decode()
    assert "\nFROM ubuntu:24.04\n" in docker and "ENV PATH=/opt/conda/envs/testbed/bin:$PATH\n" in docker
    assert docker.endswith("USER 2000:2000\n") and "useradd --uid 2000 --gid 2000" in docker
    assert "harness_python=/opt/venv/bin/python\n" in prepare
    assert "pip install --no-cache-dir 'httpx>=0.27,<1' 'mini-swe-agent>=2.4,<3'\n" in prepare
    with pytest.raises(ImageError, match="not empty"):
        main(argv)
