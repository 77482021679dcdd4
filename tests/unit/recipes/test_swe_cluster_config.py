"""The Orchard-SWE cluster recipe and its Kubernetes manifests: the recipe validates with `orchard run`'s loader on
Kafka and S3, every command and option it and the manifests use exists, every ORCHARD_* variable is a setting the
components read (loaded through their pydantic settings), and the recipe, the run pod, the episode runtime's
configs and the RBAC agree on names, ports and paths."""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer.main
import yaml
from pydantic_settings import BaseSettings

from consumers.builtin import available
from consumers.dense.settings import DistillationSettings, JudgeSettings, RuleSettings
from orchard.cli.main import app
from orchard.config import KafkaBusConfig, S3StoreConfig
from orchard.run.commands import component_args
from orchard.run.config import CommandComponent, EnvComponent, RunConfig, load_run_config
from orchard.run.rundir import resolve_orchard_config
from orchard.run.settings import FullConfig
from orchard.sandbox.kubernetes.objects import KubernetesRuntimeConfig
from producers.proxy.settings import ProxySettings
from recipes.swe import swebench_build
from recipes.swe.images import IMAGE_REFERENCE
from tests.unit.recipes.run_copy import module_argv, write_run_copy
from trainers.config import PolicyTrainerConfig, load_trainer_config

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ROOT / "recipes" / "swe" / "cluster.yaml"
LOCAL_RECIPE = ROOT / "recipes" / "swe" / "local.yaml"
MANIFESTS = ROOT / "infra" / "k8s" / "swe"
NAMESPACES = {"orchard", "orchard-swe-episodes"}
PENDING_OPTIONS: dict[tuple[str, ...], set[str]] = {}
"""Options the SWE deployment may use before `orchard` has them (none now)."""
PREFIXED_SETTINGS: list[tuple[str, type[BaseSettings]]] = [
    ("ORCHARD_PROXY_", ProxySettings),
    ("ORCHARD_DISTILLATION_", DistillationSettings),
    ("ORCHARD_PRM_", JudgeSettings),
    ("ORCHARD_RULE_PRM_", RuleSettings),
]
CLI_VARIABLES = {"ORCHARD_ENV_TOKEN", "ORCHARD_CONFIG"}
"""Read by the command line itself (the Env's bearer token, the config file), not by a settings model."""
GPUS = {
    "swe-teacher-vllm": 2,
    "swe-engine": 1,
    "swe-policy-trainer": 8,
    "swe-value-trainer": 1,
    "orchard-swe-run": 2,
}


# ---------------------------------------------------------------------------------------------------- helpers
@pytest.fixture(scope="module")
def recipe() -> RunConfig:
    """The cluster recipe, loaded as `orchard run` loads it."""
    return load_run_config(RECIPE)


@pytest.fixture(scope="module")
def docs() -> dict[str, list[dict[str, Any]]]:
    """Every document of every manifest, by file name."""
    return {
        path.name: [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        for path in sorted(MANIFESTS.glob("*.yaml"))
    }


def find(docs: dict[str, list[dict[str, Any]]], kind: str, name: str) -> dict[str, Any]:
    """The one document of ``kind`` named ``name``."""
    [doc] = [d for ds in docs.values() for d in ds if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def workloads(docs: dict[str, list[dict[str, Any]]]) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(name, pod spec, container)`` of every Deployment and Job container."""
    for doc in (d for ds in docs.values() for d in ds if d["kind"] in ("Deployment", "Job")):
        pod = doc["spec"]["template"]["spec"]
        for container in pod["containers"]:
            yield doc["metadata"]["name"], pod, container


def container_env(docs: dict[str, list[dict[str, Any]]], container: dict[str, Any]) -> dict[str, str]:
    """A container's environment as its pod would see it (the placeholder Secrets' values; pod fields stood in for)."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env |= find(docs, "ConfigMap", source["configMapRef"]["name"])["data"]
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "secretKeyRef" in item["valueFrom"]:
            secret = item["valueFrom"]["secretKeyRef"]
            if secret["name"] == "orchard-minio":  # minio.yaml, one directory up
                env[item["name"]] = "a-long-secret-stand-in-value"
            else:
                env[item["name"]] = find(docs, "Secret", secret["name"])["stringData"][secret["key"]]
        else:
            env[item["name"]] = "pod-0"
    return env


def settings_of(name: str) -> type[BaseSettings] | None:
    """The settings model reading variable ``name`` (None: read by the command line); fails on an unknown name."""
    if name in CLI_VARIABLES:
        return None
    for prefix, model in PREFIXED_SETTINGS:
        if name.startswith(prefix):
            assert name[len(prefix) :].lower() in model.model_fields, f"{name} is no field of {model.__name__}"
            return model
    top = name.removeprefix("ORCHARD_").split("__")[0].lower()
    assert name.startswith("ORCHARD_") and top in FullConfig.model_fields, f"{name} is no Orchard setting"
    return FullConfig


def load_settings(env: dict[str, str], recipe: RunConfig | None = None) -> dict[type[BaseSettings], BaseSettings]:
    """Every settings model the ORCHARD_* variables of ``env`` feed, loaded from exactly that environment (with
    ``recipe``: Orchard's config as `orchard run` resolves it, the recipe's sections overridden by ``env``)."""
    ours = {k: v for k, v in env.items() if k.startswith("ORCHARD_")}
    models = {model for model in map(settings_of, ours) if model is not None} | {FullConfig}
    loaded: dict[type[BaseSettings], BaseSettings] = {}
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("ORCHARD_")]:
            patch.delenv(key)
        for key, value in ours.items():
            patch.setenv(key, value)
        for model in models - ({FullConfig} if recipe is not None else set()):
            extra = {"backend_base_url": "http://engine:8000/v1"} if model is ProxySettings else {}
            loaded[model] = model(**extra)
        if recipe is not None:
            loaded[FullConfig] = resolve_orchard_config(recipe, Path("/runs/swe-cluster"))
    return loaded


def check_orchard_words(words: list[str]) -> list[str]:
    """The subcommand path of ``orchard WORDS``; fails on an unknown subcommand or option."""
    command: Any = typer.main.get_command(app)
    path: list[str] = []
    while hasattr(command, "commands"):
        word = words[len(path)]
        assert word in command.commands, f"no command orchard {' '.join([*path, word])}"
        command = command.commands[word]
        path.append(word)
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    known |= PENDING_OPTIONS.get(tuple(path), set())
    unknown = [w.split("=")[0] for w in words[len(path) :] if w.startswith("--") and w.split("=")[0] not in known]
    assert not unknown, f"orchard {' '.join(path)}: unknown options {unknown}"
    return path


def command_lines(container: dict[str, Any]) -> list[list[str]]:
    """The command lines a container runs: its argv, or each command of an ``sh -c`` script."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if argv[:2] != ["sh", "-c"]:
        return [argv]
    pieces = argv[2].replace("&&", ";").split(";")
    return [words for piece in pieces if (words := shlex.split(piece))]


def check_swebench_build(words: list[str], monkeypatch: pytest.MonkeyPatch) -> swebench_build.SwebenchBuildConfig:
    """Parse a ``python -m recipes.swe.swebench_build ...`` line with the module's own command line."""
    seen: list[swebench_build.SwebenchBuildConfig] = []
    monkeypatch.setattr(swebench_build, "build_swebench", lambda *args, **kwargs: seen.append(args[3]))
    start = words.index("recipes.swe.swebench_build") + 1
    assert swebench_build.main(words[start:]) == 0
    return seen[0]


# ---------------------------------------------------------------------------------------------------- recipe
def test_the_cluster_recipe_validates_and_runs_on_kafka_and_s3(recipe: RunConfig, tmp_path: Path) -> None:
    assert isinstance(recipe.bus, KafkaBusConfig) and isinstance(recipe.store, S3StoreConfig)
    assert recipe.bus.bootstrap_servers == "orchard-kafka-bootstrap.orchard.svc:9092"
    assert (recipe.store.endpoint, recipe.store.bucket) == ("minio.orchard.svc:9000", "orchard")
    with pytest.MonkeyPatch.context() as patch:
        for key in [k for k in os.environ if k.startswith("ORCHARD_")]:
            patch.delenv(key)
        patch.setenv("ORCHARD_STORE__ACCESS_KEY", "key")
        resolved = resolve_orchard_config(recipe, tmp_path)
    assert (resolved.bus.type, resolved.store.type, resolved.run_id) == ("kafka", "s3", "swe-cluster")
    assert resolved.store.access_key.get_secret_value() == "key"  # type: ignore[union-attr]


def test_the_stages_mirror_the_local_recipe(recipe: RunConfig) -> None:
    local = load_run_config(LOCAL_RECIPE)
    assert [stage.name for stage in recipe.stages] == [stage.name for stage in local.stages]
    assert [stage.name for stage in recipe.stages] == [
        "setup", "demos", "credit-sft", "eval-credit-sft", "rl-bar", "eval-rl-bar", "dense", "eval-dense", "value",
        "eval-rerank", "report",
    ]  # fmt: skip


def test_the_policy_is_a_real_checkpoint_served_by_vllm_and_the_teacher_an_attached_vllm_server(
    recipe: RunConfig,
) -> None:
    engine, expert = recipe.components["engine"], recipe.components["expert"]
    assert (engine.kind, engine.backend, engine.model, engine.reload) == (  # type: ignore[union-attr]
        "engine", "vllm", "/models/Qwen2.5-Coder-7B-Instruct", True,
    )  # fmt: skip
    assert (expert.kind, expert.backend) == ("engine", "vllm")  # type: ignore[union-attr]
    assert expert.args[:2] == ["--vllm-url", "http://swe-teacher-vllm.orchard.svc:8000"]
    assert recipe.components["proxy"].backend == "expert"  # type: ignore[union-attr]  # the demos are recorded
    assert recipe.components["demos"].model == "Qwen2.5-Coder-32B-Instruct"  # type: ignore[union-attr]
    rl = recipe.components["rollout-rl"]
    assert (rl.kind, rl.min_rollouts, rl.max_rollouts, rl.model) == ("rollout", 2, 8, "Qwen2.5-Coder-7B-Instruct")  # type: ignore[union-attr]


def test_every_component_runs_an_orchard_command_with_options_that_exist(recipe: RunConfig, tmp_path: Path) -> None:
    paths = {}
    for name, spec in recipe.components.items():
        if isinstance(spec, CommandComponent):
            if "orchard" in spec.run:
                paths[name] = check_orchard_words(spec.run[spec.run.index("orchard") + 1 :])
        else:
            paths[name] = check_orchard_words(component_args(name, spec, recipe, tmp_path))
    assert paths["env"] == ["env", "serve"] and paths["eval-rerank"] == ["eval"]
    assert paths["trainer-rl"] == ["train", "policy"] and paths["value-trainer"] == ["train", "value"]


def test_the_setup_commands_build_each_part_of_the_tasks_block_read_from_the_runs_copy_of_the_recipe(
    recipe: RunConfig, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(swebench_build, "build_swebench", lambda *args, **kwargs: calls.append((*args, kwargs)))
    write_run_copy(recipe, tmp_path)
    for name in ("setup-train", "setup-eval"):
        spec = recipe.components[name]
        assert isinstance(spec, CommandComponent) and spec.run[:3] == ["python", "-m", "recipes.swe.swebench_build"]
        assert swebench_build.main(module_argv(recipe, name, tmp_path)) == 0
    run_dir = tmp_path.resolve()
    limits = {"max_steps": 50, "harness_timeout_s": 3600, "grade_timeout_s": 1800, "skip_unsupported": True,
              "image_template": "registry.example.com/orchard-swe:{instance_id}"}  # fmt: skip
    assert calls == [
        (Path("/data/swe-gym/swe-gym.jsonl"), Path("/data/repos"), run_dir / "swe-gym",
         swebench_build.SwebenchBuildConfig(split="train", **limits), {"overwrite": True}),
        (Path("/data/swe-bench/swe-bench-verified.jsonl"), Path("/data/repos"), run_dir / "swe-bench",
         swebench_build.SwebenchBuildConfig(split="eval", **limits), {"overwrite": True}),
    ]  # fmt: skip
    envs = {name: recipe.components[name] for name in ("env", "eval-env", "rl-env")}
    assert {name: str(spec.tasks) for name, spec in envs.items()} == {  # type: ignore[union-attr]
        "env": "{run_dir}/swe-gym/train", "eval-env": "{run_dir}/swe-bench/eval", "rl-env": "{run_dir}/swe-gym/train",
    }  # fmt: skip


def test_the_trainer_overrides_and_component_environments_are_valid_settings(recipe: RunConfig) -> None:
    trainers = {name: spec for name, spec in recipe.components.items() if spec.kind == "policy-trainer"}
    assert sorted(trainers) == ["trainer-credit", "trainer-dense", "trainer-rl"]
    for spec in trainers.values():
        config = load_trainer_config(None, [item.replace("{run_dir}", "/runs/x") for item in spec.set])  # type: ignore[union-attr]
        assert (config.model.type, config.backend.type, config.precision) == ("checkpoint", "deepspeed", "bf16")
        assert str(config.model.path) == recipe.model  # type: ignore[union-attr]
    for name, spec in recipe.components.items():
        settings = load_settings(spec.env)
        if name == "distillation":
            distillation = settings[DistillationSettings]
            assert distillation.teacher_model == recipe.expert["model"]  # type: ignore[attr-defined]
            assert distillation.teacher_url == recipe.expert["url"]  # type: ignore[attr-defined]
        if name == "builder-dense":
            scorers = settings[FullConfig].consumers.sample_builder.scorers  # type: ignore[attr-defined]
            assert set(scorers) == {"rule_process_reward", "distillation"}
            assert set(scorers) <= set(available())  # registered plug-ins, by the names their scores carry


# ---------------------------------------------------------------------------------------------------- manifests
def test_every_manifest_document_is_named_and_namespaced(docs: dict[str, list[dict[str, Any]]]) -> None:
    assert sorted(docs) == [
        "config.yaml", "consumers.yaml", "engine.yaml", "env.yaml", "eval.yaml", "rbac.yaml", "rollout.yaml",
        "run.yaml", "storage.yaml", "tasks.yaml", "teacher.yaml", "trainers.yaml",
    ]  # fmt: skip
    for name, documents in docs.items():
        assert documents, name
        for doc in documents:
            assert doc["apiVersion"] and doc["kind"] and doc["metadata"]["name"], (name, doc)
            if doc["kind"] != "Namespace":
                assert doc["metadata"]["namespace"] in NAMESPACES, (name, doc["metadata"]["name"])


def test_every_container_names_an_image_and_gpus_go_where_the_models_run(
    docs: dict[str, list[dict[str, Any]]],
) -> None:
    gpus = {}
    for name, _, container in workloads(docs):
        assert IMAGE_REFERENCE.match(container["image"]), (name, container.get("image"))
        requests = container["resources"]["requests"]
        if "nvidia.com/gpu" in requests:
            assert container["resources"]["limits"]["nvidia.com/gpu"] == requests["nvidia.com/gpu"]
            gpus[name] = int(requests["nvidia.com/gpu"])
    assert gpus == GPUS


def test_every_orchard_command_and_option_in_the_manifests_exists(
    docs: dict[str, list[dict[str, Any]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    commands: dict[str, list[list[str]]] = {}
    for name, _, container in workloads(docs):
        for words in command_lines(container):
            at = next((i for i, w in enumerate(words) if w == "orchard" or w.endswith("command -v orchard)")), None)
            if at is not None:
                commands.setdefault(name, []).append(path := check_orchard_words(words[at + 1 :]))
                if path == ["consumer", "run"]:
                    assert words[at + 3] in available(), name  # a name `orchard consumer run` knows
            elif "recipes.swe.swebench_build" in words:
                config = check_swebench_build(words, monkeypatch)
                commands.setdefault(name, []).append([f"swebench_build:{config.split}"])
    assert commands["swe-env"] == [["env", "serve"]] and commands["swe-eval"] == [["eval"]]
    assert commands["swe-policy-trainer"] == [["train", "policy"]] and commands["swe-rollout"] == [["rollout", "run"]]
    assert commands["swe-tasks"] == [["swebench_build:train"], ["swebench_build:eval"]]
    assert commands["orchard-swe-run"] == [["run"], ["run"]]
    assert sum(paths == [["consumer", "run"]] for paths in commands.values()) == 4
    [(_, _, trainer)] = [w for w in workloads(docs) if w[0] == "swe-policy-trainer"]
    assert f"--num_gpus {GPUS['swe-policy-trainer']} " in trainer["command"][-1]  # one rank per requested GPU


def test_every_orchard_variable_is_a_setting_and_loads_through_its_settings_model(
    recipe: RunConfig, docs: dict[str, list[dict[str, Any]]]
) -> None:
    for name, _, container in workloads(docs):
        env = container_env(docs, container)
        settings = load_settings(env, recipe if name == "orchard-swe-run" else None)
        if container.get("envFrom") or name == "orchard-swe-run":
            config = settings[FullConfig]
            assert (config.bus.type, config.store.type, config.run_id) == ("kafka", "s3", "swe-cluster"), name  # type: ignore[attr-defined]
        if name == "swe-distillation":
            assert settings[DistillationSettings].teacher_url == "http://swe-teacher-vllm.orchard.svc:8000"  # type: ignore[attr-defined]
        if name == "swe-proxy":
            assert settings[ProxySettings].admin_token.get_secret_value()  # type: ignore[attr-defined]
    bus = find(docs, "ConfigMap", "orchard-swe")["data"]
    assert bus["ORCHARD_BUS__BOOTSTRAP_SERVERS"] == "orchard-kafka-bootstrap.orchard.svc:9092"


def test_the_trainer_config_and_the_episode_runtime_configs_validate(docs: dict[str, list[dict[str, Any]]]) -> None:
    trainer = PolicyTrainerConfig.model_validate(
        yaml.safe_load(find(docs, "ConfigMap", "orchard-swe-trainer")["data"]["trainer.yaml"])
    )
    assert (trainer.loss.kind, trainer.backend.type, str(trainer.model.path)) == (  # type: ignore[union-attr]
        "rl", "deepspeed", "/models/Qwen2.5-Coder-7B-Instruct",
    )  # fmt: skip
    runtimes = {
        key: KubernetesRuntimeConfig.model_validate(yaml.safe_load(text))
        for key, text in find(docs, "ConfigMap", "orchard-swe-runtime")["data"].items()
    }
    assert {key: config.proxy.port for key, config in runtimes.items()} == {
        "runtime-policy.yaml": 8101,
        "runtime-teacher.yaml": 8100,
    }
    episodes = find(docs, "Namespace", "orchard-swe-episodes")["metadata"]["name"]
    role = find(docs, "RoleBinding", "orchard-swe-episode-runtime")
    assert role["metadata"]["namespace"] == episodes and role["roleRef"]["name"] == "orchard-swe-episode-runtime"
    [subject] = role["subjects"]
    for config in runtimes.values():
        assert config.namespace == episodes and config.default_image is None  # every task names its image
        assert config.proxy.namespace_selector == {"kubernetes.io/metadata.name": subject["namespace"]}
    for name, pod, _ in workloads(docs):
        if name in ("swe-env", "swe-eval-env", "orchard-swe-run"):
            assert pod["serviceAccountName"] == subject["name"], name


def test_the_recipe_the_run_pod_and_the_episode_network_policy_agree(
    recipe: RunConfig, docs: dict[str, list[dict[str, Any]]]
) -> None:
    service, job = find(docs, "Service", "orchard-swe-run"), find(docs, "Job", "orchard-swe-run")
    pod = job["spec"]["template"]
    [container] = pod["spec"]["containers"]
    labels = pod["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    runtime_data = find(docs, "ConfigMap", "orchard-swe-runtime")["data"]
    proxies = {spec.port: name for name, spec in recipe.components.items() if spec.kind == "proxy"}  # type: ignore[union-attr]
    assert {port["port"] for port in service["spec"]["ports"]} == set(proxies)
    for name, spec in recipe.components.items():
        if not isinstance(spec, EnvComponent):
            continue
        host, port = spec.proxy.removeprefix("http://").split(":")
        assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc", name
        assert spec.after == [proxies[int(port)]], name
        runtime_file = Path(spec.args[spec.args.index("--runtime-config") + 1])
        assert volumes[mounts[str(runtime_file.parent)]]["configMap"]["name"] == "orchard-swe-runtime", name
        runtime = KubernetesRuntimeConfig.model_validate(yaml.safe_load(runtime_data[runtime_file.name]))
        assert runtime.proxy.port == int(port), name  # the one port episode pods may reach is their proxy's
        assert runtime.proxy.pod_selector is not None and runtime.proxy.pod_selector.items() <= labels.items()
    proxy_pod = find(docs, "Deployment", "swe-proxy")["spec"]["template"]["metadata"]["labels"]
    policy = KubernetesRuntimeConfig.model_validate(yaml.safe_load(runtime_data["runtime-policy.yaml"]))
    assert policy.proxy.pod_selector is not None and policy.proxy.pod_selector.items() <= proxy_pod.items()
    recipe_mount = next(path for path, volume in mounts.items() if volume == "recipe")
    assert f"{recipe_mount}/cluster.yaml" in container["command"][-1]
    devices = {spec.env.get("CUDA_VISIBLE_DEVICES") for spec in recipe.components.values()} - {None}
    assert len(devices) == int(container["resources"]["requests"]["nvidia.com/gpu"])
