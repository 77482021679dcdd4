from roman import from_roman, to_roman


def test_repeated_symbols_add_up():
    assert from_roman("III") == 3
    assert from_roman("XX") == 20


def test_round_trip_all_numbers():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 4000))


def test_subtractive_pairs():
    assert from_roman("MCMXCIV") == 1994
