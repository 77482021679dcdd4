from eventbus import EventBus


def test_publish_reaches_all_handlers():
    bus, seen = EventBus(), []
    bus.subscribe("t", lambda p: seen.append(("a", p)))
    bus.subscribe("t", lambda p: seen.append(("b", p)))
    assert bus.publish("t", 1) == 2
    assert seen == [("a", 1), ("b", 1)]


def test_unsubscribe():
    bus, seen = EventBus(), []
    off = bus.subscribe("t", seen.append)
    off()
    assert bus.publish("t", 1) == 0


def test_unknown_topic():
    assert EventBus().publish("nobody", 1) == 0
