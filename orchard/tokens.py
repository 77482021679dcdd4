"""Token ids, logprobs and masks packed as little-endian ``bytes`` for Avro records.

Token arrays go on the bus as packed ``bytes`` fields, not Avro arrays: for a ModelCall with 4,096 prompt and 512
completion tokens fastavro encodes ~2,400 records/s with ``array<int>`` and ~146,000 with packed bytes. A schema marks
such a field with ``"orchard.packed": "<kind>"``; the kinds are the keys of ``PACKED_DTYPES``.

Unpacking is zero-copy (``numpy.frombuffer``), so the arrays it returns are read-only views of the record's bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from orchard.serialization_errors import PackedArrayError

PackedKind = Literal["int32", "float32", "uint8"]
PackedInput = Sequence[int] | Sequence[float] | npt.NDArray[np.generic] | bytes
"""What the pack functions accept: a sequence, a 1-D numpy array, or already-packed bytes (passed through)."""

PACKED_DTYPES: Final[dict[str, np.dtype[np.generic]]] = {
    "int32": np.dtype("<i4"),
    "float32": np.dtype("<f4"),
    "uint8": np.dtype("u1"),
}
_ACCEPTED_KINDS: Final[dict[str, str]] = {"int32": "iu", "float32": "iuf", "uint8": "iub"}
_INTEGER_RANGES: Final[dict[str, tuple[int, int]]] = {"int32": (-(2**31), 2**31 - 1), "uint8": (0, 255)}


def pack_array(values: PackedInput, kind: str) -> bytes:
    """Pack a 1-D sequence or array as little-endian ``kind`` values; ``bytes`` are checked and passed through."""
    dtype = _dtype(kind)
    if isinstance(values, bytes | bytearray | memoryview):
        _check_length(len(values), dtype, kind)
        return bytes(values)
    array = np.asarray(values)
    if array.ndim != 1:
        raise PackedArrayError(f"{kind} array must be 1-D, got shape {array.shape}")
    if array.size == 0:
        return b""
    if array.dtype.kind not in _ACCEPTED_KINDS[kind]:
        raise PackedArrayError(f"cannot pack values of dtype {array.dtype} as {kind}")
    if kind in _INTEGER_RANGES and not np.can_cast(array.dtype, dtype):
        (min_, max_), low, high = _INTEGER_RANGES[kind], int(array.min()), int(array.max())
        if low < min_ or high > max_:
            raise PackedArrayError(f"values in [{low}, {high}] do not fit {kind} [{min_}, {max_}]")
    return array.astype(dtype, copy=False).tobytes()


def unpack_array(data: bytes | bytearray | memoryview, kind: str) -> npt.NDArray[np.generic]:
    """Unpack little-endian ``kind`` values; raise ``PackedArrayError`` if the length is not a whole number of items."""
    dtype = _dtype(kind)
    _check_length(len(data), dtype, kind)
    array = np.frombuffer(data, dtype=dtype)
    return array if dtype.isnative else array.astype(dtype.newbyteorder("="))


def pack_token_ids(ids: PackedInput) -> bytes:
    """Pack token ids as little-endian int32 (4 bytes per token)."""
    return pack_array(ids, "int32")


def unpack_token_ids(data: bytes | bytearray | memoryview) -> npt.NDArray[np.int32]:
    """Unpack little-endian int32 token ids (a read-only view of ``data``)."""
    return unpack_array(data, "int32")  # type: ignore[return-value]


def pack_logprobs(logprobs: PackedInput) -> bytes:
    """Pack logprobs (or any per-token floats: advantages, weights) as little-endian float32."""
    return pack_array(logprobs, "float32")


def unpack_logprobs(data: bytes | bytearray | memoryview) -> npt.NDArray[np.float32]:
    """Unpack little-endian float32 values (a read-only view of ``data``)."""
    return unpack_array(data, "float32")  # type: ignore[return-value]


def pack_loss_mask(mask: PackedInput) -> bytes:
    """Pack a per-token loss mask (booleans or 0/1) as one uint8 per token."""
    return pack_array(mask, "uint8")


def unpack_loss_mask(data: bytes | bytearray | memoryview) -> npt.NDArray[np.uint8]:
    """Unpack a per-token uint8 loss mask (a read-only view of ``data``)."""
    return unpack_array(data, "uint8")  # type: ignore[return-value]


def _dtype(kind: str) -> np.dtype[np.generic]:
    try:
        return PACKED_DTYPES[kind]
    except KeyError:
        raise PackedArrayError(f"unknown packed kind {kind!r}; expected one of {sorted(PACKED_DTYPES)}") from None


def _check_length(length: int, dtype: np.dtype[np.generic], kind: str) -> None:
    if length % dtype.itemsize:
        raise PackedArrayError(f"{length} bytes is not a whole number of {kind} values ({dtype.itemsize} bytes each)")
