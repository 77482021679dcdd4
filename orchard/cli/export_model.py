"""``orchard export-model RUN VERSION OUT``: a published policy version as a directory any Hugging Face user can load.

``RUN`` is a run directory (its ``orchard.yaml`` gives the bus, store and run id) or a run id on the configured
store; ``VERSION`` a number or ``latest``. The files are downloaded and checked against the version's manifest
(sha256); a trainer publishes the weights with their tokenizer and chat template, so ``AutoTokenizer`` and
``AutoModelForCausalLM`` both load ``OUT``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from orchard.artifacts import policy_artifact_name
from orchard.cli.common import console, state
from orchard.exceptions import OrchardError
from orchard.store import open_store


def export_model(
    ctx: typer.Context,
    run: str = typer.Argument(..., metavar="RUN", help="Run directory (with orchard.yaml) or run id."),
    version: str = typer.Argument(..., metavar="VERSION", help="Version number, or 'latest'."),
    out: Path = typer.Argument(..., metavar="OUT", help="Directory to write (must not exist or be empty)."),
    model: str = typer.Option("policy", "--model", help="Model name of the published versions (PolicyVersion.model)."),
) -> None:
    """Write a published policy version (weights, config, tokenizer, chat template) into OUT."""
    cli = state(ctx)
    run_dir = Path(run)
    if (run_dir / "orchard.yaml").is_file() and cli.config_path is None:
        cli.config_path = run_dir / "orchard.yaml"
    config = cli.config()
    run_id = config.run_id if (run_dir / "orchard.yaml").is_file() else run
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise OrchardError(f"{out} exists and is not an empty directory; give a new one")
    artifact = policy_artifact_name(run_id, model)
    with open_store(config.store) as store:
        versions = store.list_versions(artifact)
        if not versions:
            raise OrchardError(f"run {run_id!r} has no published version of model {model!r} ({artifact} is empty)")
        if version == "latest":
            chosen = versions[-1]
        elif version.isdigit() and int(version) in versions:
            chosen = int(version)
        else:
            raise OrchardError(f"VERSION must be 'latest' or one of {versions[0]}..{versions[-1]}, not {version!r}")
        manifest = store.download_version(artifact, chosen, out, verify=True)
    files = sorted(p.name for p in out.iterdir() if p.is_file())
    console.print(f"exported {artifact} v{chosen} ({len(manifest.files)} files, checked) to {out}: {', '.join(files)}",
                  highlight=False, soft_wrap=True)  # fmt: skip
    if "tokenizer_config.json" not in files:
        console.print("[yellow]this version has no tokenizer files[/] (published before trainers shipped them)")
