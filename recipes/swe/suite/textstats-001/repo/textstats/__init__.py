"""Small text statistics helpers."""

from textstats.stats import average_word_length, median_word_length, top_words, word_counts
from textstats.tokens import words

__all__ = ["average_word_length", "median_word_length", "top_words", "word_counts", "words"]
