"""The sandbox: its interface (``base``), the runtimes behind it (``local/``, ``kubernetes/``), the factory that picks
one from config (``factory.open_runtime``), and its REST API and client. The interface is re-exported here; the
runtimes and the factory are imported from their own modules, so importing the interface loads no backend."""

from orchard.sandbox.base import (
    MAX_MIB,
    SANDBOX_ID_PATTERN,
    ExecResult,
    FileEntry,
    GraderRun,
    Limits,
    PtySession,
    Runtime,
    Sandbox,
    SandboxInfo,
    SandboxSpec,
    argv_of,
)

__all__ = [
    "MAX_MIB",
    "SANDBOX_ID_PATTERN",
    "ExecResult",
    "FileEntry",
    "GraderRun",
    "Limits",
    "PtySession",
    "Runtime",
    "Sandbox",
    "SandboxInfo",
    "SandboxSpec",
    "argv_of",
]
