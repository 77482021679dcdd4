"""Avro schemas of every record Orchard publishes, laid out as a catalog of released versions.

``schemas/<RecordName>/v<N>.avsc`` holds version N of record ``dev.orchard.<RecordName>``. The highest version of a
name is the current (reader) schema; released versions are never edited, a change is a new ``v<N+1>.avsc`` that is
both backward and forward compatible with the one before it (``orchard schemas check``). ``README.md`` documents every
field. Load the catalog with ``orchard.schema_catalog.SchemaCatalog.load()``.
"""

from pathlib import Path
from typing import Final

SCHEMA_DIR: Final[Path] = Path(__file__).resolve().parent
"""Directory holding one folder of ``v<N>.avsc`` files per record name."""

__all__ = ["SCHEMA_DIR"]
