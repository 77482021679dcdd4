"""Images in recorded model calls without bloating the bus: content parts replaced by digest references.

A screenshot sent as an OpenAI content part (``{"type": "image_url", "image_url": {"url": "data:image/png;base64,
..."}}`` in chat messages, or ``{"type": "input_image", "image_url": "data:..."}`` in Responses input) is tens of
kilobytes, re-sent with the whole history at every call. Before a call is recorded, ``extract_images`` replaces each
inline image's URL by ``orchard-image://sha256:<hex>`` (the SHA-256 of the decoded bytes) and returns the bytes by
digest; ``ImageRecorder`` stores them once under ``images/sha256/<hex>`` in the artifact store (``orchard.store``:
local directory or S3), skipping digests it has already stored. The ModelCall's ``request_messages_json`` then
carries ~90 bytes per image, and identical screenshots across calls and episodes are stored once. The rewrite is
deterministic, so a conversation's rewritten messages still extend its previous call's, and prefix-delta recording
keeps working. ``restore_images`` puts the data URLs back (for a trainer of a vision model, or to replay a call).

Everything else in a part (``detail``, other keys) is kept. URLs that are not ``data:`` URLs (``https://...``) are
left as they are: there are no bytes to store. The media type is not in the reference; ``restore_images`` reads it
from the bytes (PNG, JPEG, GIF, WebP; else ``application/octet-stream``).
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchard.store import ArtifactStore

REF_PREFIX = "orchard-image://sha256:"
STORE_PREFIX = "images/sha256/"
DATA_URL = re.compile(r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?:;[\w=.+-]+)*;base64,(?P<data>.*)$", re.DOTALL)
REF = re.compile(r"^orchard-image://sha256:(?P<hex>[0-9a-f]{64})$")
Message = dict[str, Any]


class ImageRefError(ValueError):
    """An image part that cannot be read, or a reference whose bytes are missing or wrong."""


def store_key(digest: str) -> str:
    """Where the image with ``digest`` (hex) is kept in the artifact store."""
    return STORE_PREFIX + digest


def sniff_media_type(data: bytes) -> str:
    """The image type of ``data`` from its first bytes.

    >>> sniff_media_type(b"\\x89PNG\\r\\n\\x1a\\n..."), sniff_media_type(b"\\xff\\xd8\\xff\\xe0")
    ('image/png', 'image/jpeg')
    """
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def _url_of(part: Mapping[str, Any]) -> tuple[str | None, bool]:
    """The part's image URL and whether it is nested (chat ``image_url: {url}``) or flat (Responses)."""
    kind, value = part.get("type"), part.get("image_url")
    if kind not in ("image_url", "input_image"):
        return None, False
    if isinstance(value, Mapping):
        return (value["url"] if isinstance(value.get("url"), str) else None), True
    return (value if isinstance(value, str) else None), False


def _with_url(part: Mapping[str, Any], url: str, nested: bool) -> dict[str, Any]:
    out = dict(part)
    out["image_url"] = {**part["image_url"], "url": url} if nested else url
    return out


def _map_parts(
    messages: Sequence[Mapping[str, Any]], change: Callable[[dict[str, Any]], dict[str, Any]]
) -> list[Message]:
    """A deep copy of ``messages`` with ``change`` applied to every content part (message content and tool output)."""
    out = []
    for message in messages:
        copied = copy.deepcopy(dict(message))
        for field in ("content", "output"):
            if isinstance(copied.get(field), list):
                copied[field] = [change(p) if isinstance(p, dict) else p for p in copied[field]]
        out.append(copied)
    return out


def extract_images(messages: Sequence[Mapping[str, Any]]) -> tuple[list[Message], dict[str, bytes]]:
    """``messages`` with every inline image replaced by its reference, and the image bytes by digest (hex).

    >>> part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGk=", "detail": "low"}}
    >>> rewritten, images = extract_images([{"role": "user", "content": [part]}])
    >>> rewritten[0]["content"][0]["image_url"]["url"][:31], list(images.values())
    ('orchard-image://sha256:8f434346', [b'hi'])
    """
    images: dict[str, bytes] = {}

    def change(part: dict[str, Any]) -> dict[str, Any]:
        url, nested = _url_of(part)
        match = DATA_URL.match(url) if url else None
        if match is None:
            return part
        try:
            data = base64.b64decode(match["data"], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ImageRefError(f"image part with an invalid base64 data URL: {exc}") from exc
        digest = hashlib.sha256(data).hexdigest()
        images[digest] = data
        return _with_url(part, REF_PREFIX + digest, nested)

    return _map_parts(messages, change), images


def referenced_digests(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """Digests of every image reference in ``messages``, in order of appearance (repeats kept)."""
    found: list[str] = []

    def visit(part: dict[str, Any]) -> dict[str, Any]:
        url, _ = _url_of(part)
        match = REF.match(url) if url else None
        if match:
            found.append(match["hex"])
        return part

    _map_parts(messages, visit)
    return found


def restore_images(
    messages: Sequence[Mapping[str, Any]], fetch: ArtifactStore | Callable[[str], bytes]
) -> list[Message]:
    """``messages`` with every reference replaced by a ``data:`` URL of its bytes (``fetch``: a store, or a function
    from digest to bytes); bytes that do not hash to their digest are an ``ImageRefError``."""
    get = (lambda digest: fetch.get_bytes(store_key(digest))) if isinstance(fetch, ArtifactStore) else fetch

    def change(part: dict[str, Any]) -> dict[str, Any]:
        url, nested = _url_of(part)
        match = REF.match(url) if url else None
        if match is None:
            return part
        data = get(match["hex"])
        if hashlib.sha256(data).hexdigest() != match["hex"]:
            raise ImageRefError(f"image {match['hex']} does not match its digest")
        encoded = base64.b64encode(data).decode()
        return _with_url(part, f"data:{sniff_media_type(data)};base64,{encoded}", nested)

    return _map_parts(messages, change)


def store_images(store: ArtifactStore, images: Mapping[str, bytes]) -> int:
    """Put each image not yet in ``store`` under its key; returns how many were written."""
    written = 0
    for digest, data in images.items():
        key = store_key(digest)
        if store.exists(key):
            continue
        info = store.put_bytes(key, data)
        if info.sha256 != digest:
            raise ImageRefError(f"stored image {key} hashed to {info.sha256}")
        written += 1
    return written


class ImageRecorder:
    """What the recording proxy calls before recording a call: rewrite its messages, store new images once.

    Thread-safe (the proxy runs it on a worker thread: storing is blocking I/O). ``remember`` digests known to be
    stored are not checked again (an LRU of that many digests), which saves a store round trip per image per call
    when a history re-sends the same screenshots.
    """

    def __init__(self, store: ArtifactStore, remember: int = 100_000) -> None:
        self.store, self.remember = store, remember
        self._known: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self.images_stored = self.bytes_seen = 0

    def rewrite(self, messages: Sequence[Mapping[str, Any]]) -> list[Message]:
        """``messages`` with inline images replaced by references, each image in the store."""
        rewritten, images = extract_images(messages)
        self.store_new(images)
        return rewritten

    def store_new(self, images: Mapping[str, bytes]) -> None:
        """Store the images of ``extract_images`` not known to be stored yet (blocking I/O)."""
        with self._lock:
            fresh = {digest: data for digest, data in images.items() if digest not in self._known}
        written = store_images(self.store, fresh)
        with self._lock:
            for digest in images:
                self._known[digest] = None
                self._known.move_to_end(digest)
            while len(self._known) > self.remember:
                self._known.popitem(last=False)
            self.images_stored += written
            self.bytes_seen += sum(len(data) for data in images.values())  # kept off the bus
