from versions import compare


def test_missing_components_are_zero():
    assert compare("1.0", "1.0.0") == 0
    assert compare("2", "2.0.0") == 0


def test_shorter_version_can_be_newer():
    assert compare("1.1", "1.0.5") == 1


def test_prerelease_before_release():
    assert compare("1.0.0-rc.1", "1.0.0") == -1
