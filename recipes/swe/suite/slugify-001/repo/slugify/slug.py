"""Building slugs."""

import re
import unicodedata


def slugify(text: str, separator: str = "-", max_length: int | None = None) -> str:
    """Lowercase ASCII words of ``text`` joined by ``separator``, at most ``max_length`` characters."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = separator.join(re.findall(r"[a-z0-9]+", ascii_text.lower()))
    if max_length is not None and len(slug) > max_length:
        slug = slug[: max_length - 1].rstrip(separator)
    return slug
