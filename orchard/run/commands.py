"""The command line of each component: exactly the ``orchard ...`` command a user runs to start it alone."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from orchard.run.config import (
    RUN_DIR,
    URL_PLACEHOLDER,
    CommandComponent,
    ComponentSpec,
    ConsumerComponent,
    EngineComponent,
    EnvComponent,
    PolicyTrainerComponent,
    ProxyComponent,
    RolloutComponent,
    RunConfig,
    ScriptedEngineComponent,
    ValueTrainerComponent,
)


def orchard_executable() -> list[str]:
    """The ``orchard`` console script of this interpreter's environment (else the one on PATH)."""
    beside = Path(sys.executable).with_name("orchard")
    if beside.exists():
        return [str(beside)]
    found = shutil.which("orchard")
    return [found] if found else [sys.executable, "-c", "from orchard.cli.main import run; run()"]


def base_url(config: RunConfig, value: str, suffix: str = "") -> str:
    """``value`` as is when it is a URL, else the address of the server component it names (plus ``suffix``)."""
    if "://" in value:
        return value
    spec = config.components[value]
    host = getattr(spec, "host", "127.0.0.1")
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host  # noqa: S104 - a wildcard bind is reached on loopback
    return f"http://{host}:{spec.listen_port()}{suffix}"


def expand_urls(words: list[str], config: RunConfig) -> list[str]:
    """``words`` with every ``{url:NAME}`` replaced by the base URL of component NAME (``base_url``)."""
    return [URL_PLACEHOLDER.sub(lambda match: base_url(config, match.group(1)), word) for word in words]


def component_command(name: str, spec: ComponentSpec, config: RunConfig, run_dir: Path) -> list[str]:
    """The whole command line of component ``name``, ``{run_dir}`` replaced by the run directory.

    A command component's ``{url:NAME}`` placeholders become the URLs of the components they name.
    """
    root = str(run_dir.resolve())
    if isinstance(spec, CommandComponent):
        first, *rest = expand_urls(spec.run, config)
        head = {"orchard": orchard_executable(), "python": [sys.executable]}.get(first, [first])
        command = [*head, *rest, *expand_urls(spec.args, config)]
    else:
        command = [*orchard_executable(), *component_args(name, spec, config, run_dir)]
    return [word.replace(RUN_DIR, root) for word in command]


def component_args(name: str, spec: ComponentSpec, config: RunConfig, run_dir: Path) -> list[str]:
    """The arguments after ``orchard`` that start component ``name`` (a command component: its own words)."""
    match spec:
        case EngineComponent():
            args = ["engine", "serve", "--model", spec.model, "--backend", spec.backend, "--host", spec.host,
                    "--port", str(spec.port), "--max-batch-size", str(spec.max_batch_size),
                    "--reload" if spec.reload else "--no-reload"]  # fmt: skip
            args += ["--cpu-threads", str(spec.cpu_threads)] if spec.cpu_threads is not None else []
        case ScriptedEngineComponent():
            args = ["engine", "scripted", str(spec.plan), "--host", spec.host, "--port", str(spec.port),
                    "--policy-version", str(spec.policy_version)]  # fmt: skip
        case ProxyComponent():
            args = ["proxy", "serve", "--backend", base_url(config, spec.backend, "/v1"), "--host", spec.host,
                    "--port", str(spec.port)]  # fmt: skip
        case EnvComponent():
            args = ["env", "serve", "--tasks", str(spec.tasks), "--proxy", base_url(config, spec.proxy),
                    "--host", spec.host, "--port", str(spec.port), "--concurrency", str(spec.concurrency),
                    "--timeout", str(spec.timeout_s), "--sandboxes", str(run_dir / "sandboxes" / name)]  # fmt: skip
        case ConsumerComponent():
            args = ["consumer", "run", spec.name, "--instance", spec.instance or name]
            args += ["--group", spec.group] if spec.group else []
            args += ["--namespace", spec.namespace] if spec.namespace else []
        case PolicyTrainerComponent():
            args = ["train", "policy"]
            args += ["--config", str(spec.config)] if spec.config else []
            args += [part for override in spec.set for part in ("--set", override)]
        case ValueTrainerComponent():
            args = ["train", "value", "--model", spec.model]
            args += ["--max-steps", str(spec.max_steps)] if spec.max_steps else []
        case RolloutComponent():
            args = ["rollout", "run", "--env", base_url(config, spec.service), "--tasks", str(spec.tasks),
                    "--harness", spec.harness, "--model", spec.model, "--budget", str(spec.budget),
                    "--min-rollouts", str(spec.min_rollouts), "--max-rollouts", str(spec.max_rollouts),
                    "--wait-timeout", str(spec.wait_timeout_s)]  # fmt: skip
            args += ["--demos", str(spec.demos)] if spec.demos else []
            args += ["--rounds", str(spec.rounds)] if spec.rounds else []
            args += ["--episodes", str(spec.episodes)] if spec.episodes else []
            args += ["--max-task-outcomes", str(spec.max_task_outcomes)] if spec.max_task_outcomes else []
            args += ["--episode-timeout", str(spec.episode_timeout_s)] if spec.episode_timeout_s else []
            args += ["--new-policy-wait", str(spec.new_policy_wait_s)] if spec.new_policy_wait_s else []
            args += ["--aim", spec.aim] if spec.aim != "mixed" else []
            args += ["--seed", str(spec.seed)] if spec.seed is not None else []
            if spec.lockstep:
                args += ["--lockstep", *(part for group in spec.lockstep_after for part in ("--lockstep-after", group))]
                args += ["--engine", base_url(config, spec.engine)] if spec.engine else []
            if (spec.prior_successes, spec.prior_failures) != (1.0, 1.0):
                args += ["--prior-successes", str(spec.prior_successes), "--prior-failures", str(spec.prior_failures)]
        case CommandComponent():
            return expand_urls([*spec.run, *spec.args], config)
    return [*args, *spec.args]
