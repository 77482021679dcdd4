from pathutils import split_ext


def test_dotfile_has_no_extension():
    assert split_ext(".bashrc") == (".bashrc", "")


def test_dotfile_in_directory():
    assert split_ext("/home/me/.profile") == ("/home/me/.profile", "")


def test_dotfile_with_extension():
    assert split_ext("/etc/.config.bak") == ("/etc/.config", ".bak")
