from pathutils import common_parent


def test_common_parent_respects_path_components():
    assert common_parent(["/data/report-2023.csv", "/data/report-2024.csv"]) == "/data"


def test_similar_directory_names():
    assert common_parent(["/home/ann/x", "/home/anna/y"]) == "/home"


def test_single_path():
    assert common_parent(["/a/b"]) == "/a/b"
