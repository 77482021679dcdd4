"""``open_store``: the one place that turns a store config into a backend."""

from __future__ import annotations

from orchard.config import LocalStoreConfig, S3StoreConfig
from orchard.logging import get_logger
from orchard.store.base import ArtifactStore
from orchard.store.local import LocalStore
from orchard.store.s3 import S3Store

_log = get_logger("store")


def open_store(config: LocalStoreConfig | S3StoreConfig) -> ArtifactStore:
    """Build the backend ``config.type`` names and ``check()`` it, so a bad store fails at start, not mid-run.

    Raises ``StoreUnavailableError`` (unreachable, bounded by the config's timeout and retries),
    ``StoreAuthError`` (credentials rejected) or ``StoreError``. Close the store (or use ``with``) when done.
    """
    store: ArtifactStore
    match config:
        case S3StoreConfig():
            store = S3Store(config)
        case LocalStoreConfig():
            store = LocalStore(config.path, fsync=config.fsync == "always")
        case _:
            raise TypeError(f"unknown store config {type(config).__name__}")
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    _log.info("store opened", location=store.location)
    return store
