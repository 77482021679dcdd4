from iniparse import Config


def test_value_may_contain_equals_sign():
    cfg = Config.from_text("[db]\nurl = postgres://u@h/db?sslmode=require\n")
    assert cfg.get("db", "url") == "postgres://u@h/db?sslmode=require"


def test_base64_padding_is_kept():
    assert Config.from_text("[auth]\ntoken = YWJjZA==\n").get("auth", "token") == "YWJjZA=="


def test_simple_value():
    assert Config.from_text("[a]\nb = c\n").get("a", "b") == "c"
