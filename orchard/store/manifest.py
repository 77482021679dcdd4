"""The manifest of a published version: every file with its size and sha256, plus name, version and metadata.

It is stored as ``manifest.json`` beside the files and written last, so its presence is what makes a version
exist. Readers ignore fields they do not know (``extra="ignore"``), so a newer writer may add fields without
breaking engines still running an older Orchard.
"""

from __future__ import annotations

from typing import Self

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from orchard.store.base import validate_key
from orchard.store.exceptions import ArtifactNotFoundError, IntegrityError

MANIFEST_NAME = "manifest.json"
"""File name of the manifest inside a version; no published file may use it at the top level."""


class ManifestFile(BaseModel):
    """One file of a version: its path inside the version, size in bytes and hex sha256."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    path: str = Field(description="'/'-separated path inside the version, e.g. 'model-00001-of-00002.safetensors'.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="Lower-case hex sha256 of the content.")

    @field_validator("path")
    @classmethod
    def _valid_path(cls, path: str) -> str:
        # A manifest is also read from the store: a path like '../x' must never reach the download's filesystem.
        return validate_key(path, what="file path")


class Manifest(BaseModel):
    """What a published version holds; a version exists exactly while its manifest does."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    manifest_version: int = Field(1, ge=1, description="Format of this document, raised on incompatible changes.")
    name: str = Field(min_length=1, description="Artifact name, e.g. 'runs/r1/policy'.")
    version: int = Field(ge=0, description="Version number, unique per name.")
    created_at: AwareDatetime = Field(description="When the publication finished (UTC).")
    files: tuple[ManifestFile, ...] = Field(description="Every file of the version, sorted by path.")
    metadata: dict[str, JsonValue] = Field(default_factory=dict, description="Free-form JSON from the publisher.")

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, files: tuple[ManifestFile, ...]) -> tuple[ManifestFile, ...]:
        paths = [entry.path for entry in files]
        duplicates = sorted({path for path in paths if paths.count(path) > 1})
        if duplicates:
            raise ValueError(f"duplicate file paths: {duplicates}")
        if MANIFEST_NAME in paths:
            raise ValueError(f"{MANIFEST_NAME!r} is reserved for the manifest itself")
        return files

    @property
    def total_size(self) -> int:
        """Sum of the sizes of all files, in bytes."""
        return sum(entry.size for entry in self.files)

    def file(self, path: str) -> ManifestFile:
        """The entry of ``path``; ``ArtifactNotFoundError`` if the version has no such file."""
        for entry in self.files:
            if entry.path == path:
                return entry
        raise ArtifactNotFoundError(f"{self.name} v{self.version} has no file {path!r}")

    def to_json(self) -> bytes:
        """The manifest as UTF-8 JSON, indented so a human can read it in the bucket."""
        return self.model_dump_json(indent=2).encode("utf-8") + b"\n"

    @classmethod
    def from_json(cls, data: bytes | str, source: str = "manifest") -> Self:
        """Parse a manifest; invalid JSON or fields raise ``IntegrityError`` naming ``source``."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(part) for part in error['loc']) or '(document)'}: {error['msg']}"
                for error in exc.errors()
            )
            raise IntegrityError(f"unreadable manifest {source}: {problems}") from exc
