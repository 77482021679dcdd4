"""The software and CPU an evaluation ran on, recorded beside its figures.

A stage's result is reproducible for a given code on a given machine: the same seeds give the same tokens. Across
machines it is not. Another CPU (another set of vector instructions, so other kernels) or another torch rounds
differently, and a tiny model's training can go down another path from there (the file-lookup recipe's (a) solved
434 of 500 held-out tasks in one environment and 496 in another, same code and seeds). So each row of
``results.json`` says where it was measured; reading it needs no model library (versions come from the installed
distributions' metadata, the CPU from ``/proc/cpuinfo``).
"""

from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path

PACKAGES = ("orchard-rl", "torch", "transformers", "tokenizers", "numpy")
"""Distributions whose version can change a trained model's numbers."""
CPUINFO = Path("/proc/cpuinfo")


def software_environment(cpuinfo: Path = CPUINFO) -> dict[str, str]:
    """Python, the ``PACKAGES`` installed (absent ones left out), the machine type and the CPU's model name and
    vector extensions (AVX-512, AVX2) where ``cpuinfo`` says."""
    env = {"python": platform.python_version(), "machine": platform.machine()}
    for name in PACKAGES:
        try:
            env[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    env.update(_cpu(cpuinfo))
    return env


def _cpu(cpuinfo: Path) -> dict[str, str]:
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("model name", "flags") and key.strip() not in fields:
            fields[key.strip()] = value.strip()
        if len(fields) == 2:
            break
    out = {"cpu": fields["model name"]} if "model name" in fields else {}
    if "flags" in fields:
        flags = set(fields["flags"].split())
        out["cpu_vector"] = next((name for name in ("avx512f", "avx2", "avx") if name in flags), "none")
    return out


def describe(env: dict[str, str]) -> str:
    """One line for a table's notes: ``torch 2.15.0, transformers 4.57.1, ..., CPU AMD EPYC (avx512f)``."""
    parts = [f"{name} {env[name]}" for name in ("python", *PACKAGES) if name in env]
    if "cpu" in env:
        parts.append(f"CPU {env['cpu']}" + (f" ({env['cpu_vector']})" if "cpu_vector" in env else ""))
    return ", ".join(parts)
