from textstats import top_words, word_counts, words


def test_accented_words_are_single_words():
    assert words("Naïve café owners") == ["naïve", "café", "owners"]


def test_non_latin_scripts_are_counted():
    assert word_counts("привет мир привет")["привет"] == 2


def test_ascii_text_unchanged():
    assert words("don't stop") == ["don't", "stop"]
    assert top_words("b a b", 1) == ["b"]
