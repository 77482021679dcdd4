"""What a checkpoint's weights look like, read from the safetensors headers alone (no torch, no tensor data).

An engine that loads new weights *in place* (vLLM) cannot fall back to the old ones once loading has started, so
a new version is compared with the served one before anything is touched: the same tensor names and shapes
(``WeightsSignature``; dtypes may differ, the engine converts), and, when both have a ``config.json``, the same
architecture. A safetensors file starts with an 8-byte little-endian header length and a JSON header mapping
each tensor to its dtype, shape and byte range; a truncated or garbled file fails here too.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchard.engines.exceptions import CheckpointError

MAX_HEADER_BYTES = 100 * 1024 * 1024
CONFIG_KEYS = ("architectures", "model_type", "vocab_size", "hidden_size", "num_hidden_layers")

WeightsSignature = dict[str, tuple[int, ...]]


def safetensors_files(directory: Path) -> list[Path]:
    """The ``*.safetensors`` files of a checkpoint directory, sorted; ``CheckpointError`` if there are none."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{directory} holds no *.safetensors file")
    return files


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file, checked against the file's size."""
    size = path.stat().st_size
    with path.open("rb") as handle:
        raw = handle.read(8)
        if len(raw) < 8:
            raise CheckpointError(f"{path.name} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", raw)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(f"{path.name} has a header length of {length} bytes in a {size}-byte file")
        try:
            header = json.loads(handle.read(length))
        except ValueError as exc:
            raise CheckpointError(f"{path.name} has an unreadable safetensors header: {exc}") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{path.name} has a safetensors header that is not an object")
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + length + end > size:
        raise CheckpointError(f"{path.name} is truncated: its tensors end at byte {8 + length + end} of {size}")
    return header


def signature(directory: Path) -> WeightsSignature:
    """Every tensor of the checkpoint: name -> shape."""
    result: WeightsSignature = {}
    for path in safetensors_files(directory):
        for name, info in read_header(path).items():
            if name != "__metadata__":
                result[name] = tuple(int(d) for d in info["shape"])
    return result


def check_compatible(directory: Path, reference: WeightsSignature, reference_config: Mapping[str, Any] | None) -> None:
    """``CheckpointError`` unless ``directory``'s weights (and config, if both have one) match the reference."""
    new = signature(directory)
    missing, extra = sorted(reference.keys() - new.keys()), sorted(new.keys() - reference.keys())
    if missing or extra:
        raise CheckpointError(f"new weights miss {missing[:5]} ({len(missing)}) / add {extra[:5]} ({len(extra)})")
    differing = [name for name in sorted(new) if new[name] != reference[name]]
    if differing:
        name = differing[0]
        raise CheckpointError(
            f"{len(differing)} tensors have other shapes, e.g. {name}: {new[name]} vs served {reference[name]}"
        )
    config_file = Path(directory) / "config.json"
    if reference_config is not None and config_file.is_file():
        config = json.loads(config_file.read_text())
        for key in CONFIG_KEYS:
            if config.get(key) != reference_config.get(key):
                served = reference_config.get(key)
                raise CheckpointError(f"new weights have {key}={config.get(key)!r}, served {served!r}")


def read_config(directory: Path) -> dict[str, Any] | None:
    """A checkpoint's ``config.json``, or None."""
    path = Path(directory) / "config.json"
    return json.loads(path.read_text()) if path.is_file() else None
