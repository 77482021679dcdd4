"""Packed token ids, logprobs and loss masks."""

from __future__ import annotations

import numpy as np
import pytest

from orchard.serialization_errors import PackedArrayError, SerializationError
from orchard.tokens import (
    pack_array,
    pack_logprobs,
    pack_loss_mask,
    pack_token_ids,
    unpack_array,
    unpack_logprobs,
    unpack_loss_mask,
    unpack_token_ids,
)


def test_token_ids_are_little_endian_int32() -> None:
    assert pack_token_ids([1, 256, -1]) == b"\x01\x00\x00\x00\x00\x01\x00\x00\xff\xff\xff\xff"


@pytest.mark.parametrize(
    "ids",
    [[0, 1, 151_643, 2**31 - 1], np.array([5, 6, 7], dtype=np.int64), np.array([9, 8], dtype=np.uint16), range(10)],
)
def test_token_ids_round_trip_lists_and_arrays(ids: object) -> None:
    unpacked = unpack_token_ids(pack_token_ids(ids))  # type: ignore[arg-type]
    assert unpacked.dtype == np.int32
    assert unpacked.tolist() == list(ids)  # type: ignore[call-overload]


def test_unpacked_arrays_are_read_only_views() -> None:
    unpacked = unpack_token_ids(pack_token_ids([1, 2, 3]))
    assert unpacked.flags.writeable is False


def test_empty_arrays_pack_to_empty_bytes() -> None:
    assert (pack_token_ids([]), pack_logprobs([]), pack_loss_mask([])) == (b"", b"", b"")
    assert unpack_token_ids(b"").tolist() == []


def test_logprobs_round_trip_as_float32() -> None:
    values = np.array([-0.5, -1.25, 0.0, -np.inf], dtype=np.float64)
    packed = pack_logprobs(values)
    assert len(packed) == 16
    assert unpack_logprobs(packed).tolist() == [-0.5, -1.25, 0.0, -np.inf]
    assert unpack_logprobs(pack_logprobs([-0.1])).tolist() == [np.float32(-0.1).item()]


def test_loss_mask_packs_one_byte_per_token() -> None:
    assert pack_loss_mask([True, False, True]) == b"\x01\x00\x01"
    assert unpack_loss_mask(b"\x01\x00\x01").tolist() == [1, 0, 1]


def test_bytes_pass_through_after_a_length_check() -> None:
    assert pack_token_ids(b"\x01\x00\x00\x00") == b"\x01\x00\x00\x00"
    with pytest.raises(PackedArrayError, match="3 bytes is not a whole number of int32 values"):
        pack_token_ids(b"\x01\x00\x00")


@pytest.mark.parametrize(
    ("data", "unpack"),
    [(b"\x00" * 5, unpack_token_ids), (b"\x00" * 7, unpack_logprobs)],
)
def test_unpack_rejects_partial_items(data: bytes, unpack: object) -> None:
    with pytest.raises(PackedArrayError, match="is not a whole number of"):
        unpack(data)  # type: ignore[operator]


def test_packed_array_errors_are_serialization_and_value_errors() -> None:
    assert issubclass(PackedArrayError, SerializationError)
    assert issubclass(PackedArrayError, ValueError)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([2**31], r"values in \[2147483648, 2147483648\] do not fit int32"),
        (np.array([-(2**40)], dtype=np.int64), "do not fit int32"),
        ([1.5, 2.0], "cannot pack values of dtype float64 as int32"),
        (["1"], "cannot pack values of dtype <U1 as int32"),
        ([[1, 2], [3, 4]], r"int32 array must be 1-D, got shape \(2, 2\)"),
    ],
)
def test_pack_token_ids_rejects_what_is_not_int32(values: object, message: str) -> None:
    with pytest.raises(PackedArrayError, match=message):
        pack_token_ids(values)  # type: ignore[arg-type]


def test_loss_mask_rejects_values_outside_uint8() -> None:
    with pytest.raises(PackedArrayError, match="do not fit uint8"):
        pack_loss_mask([0, 256])


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(PackedArrayError, match="unknown packed kind 'int64'"):
        pack_array([1], "int64")
    with pytest.raises(PackedArrayError, match="unknown packed kind 'int64'"):
        unpack_array(b"", "int64")
