from iniparse import Config


def test_mixed_case_header_found_with_lowercase_name():
    assert Config.from_text("[Server]\nport = 1\n").getint("server", "port") == 1


def test_lookup_is_case_insensitive():
    cfg = Config.from_text("[server]\nport = 2\n")
    assert cfg.getint("SERVER", "Port") == 2


def test_section_names_are_reported_lowercase():
    assert Config.from_text("[Main]\n[OTHER]\n").sections() == ["main", "other"]


def test_keys_case_insensitive():
    assert Config.from_text("[s]\nKey = v\n").get("s", "KEY") == "v"
