import pytest

from paginate import page_count, paginate


def test_partial_last_page():
    page = paginate(list(range(7)), 3, 3)
    assert page.items == [6]
    assert not page.has_next


def test_page_count_rounds_up():
    assert page_count(7, 3) == 3


def test_empty_list_has_one_page():
    assert paginate([], 1, 10).items == []


def test_out_of_range():
    with pytest.raises(ValueError):
        paginate([1, 2], 5, 1)
