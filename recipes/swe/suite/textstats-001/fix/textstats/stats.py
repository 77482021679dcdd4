"""Statistics over the words of a text."""

from collections import Counter

from textstats.tokens import words


def word_counts(text: str) -> Counter[str]:
    """Count each lowercase word of ``text``."""
    return Counter(words(text))


def top_words(text: str, n: int) -> list[str]:
    """Return the ``n`` most frequent words; ties are broken alphabetically."""
    ranked = sorted(word_counts(text).items(), key=lambda kv: (-kv[1], kv[0]))
    return [word for word, _ in ranked[:n]]


def average_word_length(text: str) -> float:
    """Mean length of the words of ``text``; 0.0 for a text without words."""
    lengths = [len(w) for w in words(text)]
    if not lengths:
        return 0.0
    return sum(lengths) / len(lengths)


def median_word_length(text: str) -> float:
    """Median length of the words of ``text``; 0.0 for a text without words."""
    lengths = sorted(len(w) for w in words(text))
    if not lengths:
        return 0.0
    mid = len(lengths) // 2
    if len(lengths) % 2:
        return float(lengths[mid])
    return (lengths[mid - 1] + lengths[mid]) / 2
