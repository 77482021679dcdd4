"""Image content parts replaced by digest references, their bytes stored once in an artifact store, and restored."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest

from orchard.config import LocalStoreConfig
from orchard.store import open_store
from producers.proxy.images import (
    REF_PREFIX,
    ImageRecorder,
    ImageRefError,
    extract_images,
    referenced_digests,
    restore_images,
    sniff_media_type,
    store_key,
)

PNG = b"\x89PNG\r\n\x1a\n" + b"pixels" * 50
JPEG = b"\xff\xd8\xff\xe0" + b"jpeg" * 40


def data_url(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


def conversation() -> list[dict[str, Any]]:
    """A chat turn with two images (one repeated later), a Responses-style input image, and a remote URL."""
    png = {"type": "image_url", "image_url": {"url": data_url(PNG, "image/png"), "detail": "low"}}
    return [
        {"role": "system", "content": "You browse."},
        {"role": "user", "content": [{"type": "text", "text": "task"}, png]},
        {"role": "tool", "tool_call_id": "c1", "content": "clicked"},
        {"role": "user", "content": [{"type": "input_image", "image_url": data_url(JPEG, "image/jpeg")}, png]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
    ]


def test_inline_images_become_references_and_everything_else_is_kept() -> None:
    messages = conversation()
    rewritten, images = extract_images(messages)
    png_digest, jpeg_digest = hashlib.sha256(PNG).hexdigest(), hashlib.sha256(JPEG).hexdigest()
    assert images == {png_digest: PNG, jpeg_digest: JPEG}
    assert rewritten[1]["content"][1] == {
        "type": "image_url",
        "image_url": {"url": REF_PREFIX + png_digest, "detail": "low"},
    }
    assert rewritten[3]["content"][0] == {"type": "input_image", "image_url": REF_PREFIX + jpeg_digest}
    assert rewritten[4] == messages[4] and rewritten[:1] == messages[:1] and rewritten[2] == messages[2]
    assert referenced_digests(rewritten) == [png_digest, jpeg_digest, png_digest]
    assert messages == conversation()  # the input is not modified


def test_a_store_holds_each_image_once_and_restoring_gives_the_request_back(tmp_path: Path) -> None:
    with open_store(LocalStoreConfig(path=str(tmp_path / "store"))) as store:
        recorder = ImageRecorder(store)
        rewritten = recorder.rewrite(conversation())
        assert recorder.rewrite(conversation()) == rewritten
        assert recorder.images_stored == 2 and sorted(store.list("images/")) == sorted(
            store_key(d) for d in set(referenced_digests(rewritten))
        )
        assert ImageRecorder(store).rewrite(conversation()) == rewritten  # a fresh recorder finds them stored
        assert restore_images(rewritten, store) == conversation()


def test_corrupt_inputs_and_tampered_bytes_are_refused() -> None:
    bad = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,!!"}}]}]
    with pytest.raises(ImageRefError, match="invalid base64"):
        extract_images(bad)
    rewritten, _ = extract_images(conversation())
    with pytest.raises(ImageRefError, match="does not match its digest"):
        restore_images(rewritten, lambda digest: b"something else")


def test_media_types_are_read_from_the_bytes() -> None:
    assert [sniff_media_type(b) for b in (PNG, JPEG, b"GIF89a..", b"RIFF\0\0\0\0WEBP", b"?")] == [
        "image/png", "image/jpeg", "image/gif", "image/webp", "application/octet-stream",
    ]  # fmt: skip
