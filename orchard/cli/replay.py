"""``orchard replay``: re-run consumers over a range of recorded topics into a separate namespace."""

from __future__ import annotations
