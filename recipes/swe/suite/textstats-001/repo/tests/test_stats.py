from textstats import average_word_length, median_word_length, top_words, word_counts, words


def test_words_are_lowercased_and_punctuation_dropped():
    assert words("Hello, World! It's fine.") == ["hello", "world", "it's", "fine"]


def test_word_counts():
    assert word_counts("a b a")["a"] == 2


def test_top_words_by_frequency():
    assert top_words("the cat and the hat and the bat", 2) == ["the", "and"]


def test_average_word_length():
    assert average_word_length("ab abcd") == 3.0


def test_median_odd_number_of_words():
    assert median_word_length("a abc abcde") == 3.0
