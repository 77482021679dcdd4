import pytest

from pathutils import common_parent, split_ext


def test_common_parent_of_siblings():
    assert common_parent(["/srv/app", "/srv/app/lib"]) == "/srv/app"


def test_common_parent_needs_paths():
    with pytest.raises(ValueError):
        common_parent([])


def test_split_ext():
    assert split_ext("/tmp/archive.tar.gz") == ("/tmp/archive.tar", ".gz")


def test_split_ext_without_extension():
    assert split_ext("Makefile") == ("Makefile", "")
