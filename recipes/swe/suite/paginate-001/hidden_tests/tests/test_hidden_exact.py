from paginate import page_count, paginate


def test_exact_multiple_has_no_extra_page():
    assert page_count(10, 5) == 2


def test_last_full_page_has_no_next():
    assert not paginate(list(range(10)), 2, 5).has_next


def test_single_item():
    assert page_count(1, 5) == 1
