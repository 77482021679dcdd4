from textstats import median_word_length


def test_median_of_two_words_is_their_mean():
    assert median_word_length("ab abcd") == 3.0


def test_median_even_number_of_words():
    assert median_word_length("a ab abcd abcdefgh") == 3.0


def test_median_odd_still_works():
    assert median_word_length("a ab abc") == 2.0


def test_median_of_empty_text():
    assert median_word_length("") == 0.0
