"""Artifact store: model weights and other files as versioned artifacts, in a local directory or an S3 bucket.

Usage::

    with open_store(config.store) as store:
        store.publish_version("runs/r1/policy", 3, {"model.safetensors": path}, {"step": 1200})
        latest = store.latest_version("runs/r1/policy")
        store.download_version("runs/r1/policy", latest, dest_dir)
"""

from orchard.store.base import ArtifactStore, ObjectInfo, ObjectReader
from orchard.store.exceptions import (
    ArtifactNotFoundError,
    IntegrityError,
    InvalidKeyError,
    SourceReadError,
    StoreAuthError,
    StoreError,
    StoreUnavailableError,
    VersionExistsError,
)
from orchard.store.factory import open_store
from orchard.store.manifest import Manifest, ManifestFile

__all__ = [
    "ArtifactNotFoundError",
    "ArtifactStore",
    "IntegrityError",
    "InvalidKeyError",
    "Manifest",
    "ManifestFile",
    "ObjectInfo",
    "ObjectReader",
    "SourceReadError",
    "StoreAuthError",
    "StoreError",
    "StoreUnavailableError",
    "VersionExistsError",
    "open_store",
]
