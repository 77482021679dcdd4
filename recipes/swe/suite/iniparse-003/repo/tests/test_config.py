import pytest

from iniparse import Config, ParseError

DOC = """
# settings
[server]
host = example.org
port = 8080
debug = yes

[client]
retries = 3
"""


def test_get_and_getint():
    cfg = Config.from_text(DOC)
    assert cfg.get("server", "host") == "example.org"
    assert cfg.getint("server", "port") == 8080


def test_getboolean():
    assert Config.from_text(DOC).getboolean("server", "debug") is True


def test_missing_value_uses_default():
    assert Config.from_text(DOC).getint("client", "timeout", 30) == 30


def test_sections_in_order():
    assert Config.from_text(DOC).sections() == ["server", "client"]


def test_key_outside_section_is_an_error():
    with pytest.raises(ParseError):
        Config.from_text("a = 1")
