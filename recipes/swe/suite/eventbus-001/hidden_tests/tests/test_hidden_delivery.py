from eventbus import EventBus


def test_once_handler_does_not_hide_the_next_one():
    bus, seen = EventBus(), []
    bus.subscribe("t", lambda p: seen.append("once"), once=True)
    bus.subscribe("t", lambda p: seen.append("always"))
    assert bus.publish("t", None) == 2
    assert seen == ["once", "always"]
    assert bus.publish("t", None) == 1


def test_handler_unsubscribing_itself():
    bus, seen = EventBus(), []
    offs = []
    offs.append(bus.subscribe("t", lambda p: (seen.append(1), offs[0]())))
    bus.subscribe("t", lambda p: seen.append(2))
    bus.publish("t", None)
    assert seen == [1, 2]


def test_handler_added_during_publish_waits_for_next_event():
    bus, seen = EventBus(), []
    bus.subscribe("t", lambda p: bus.subscribe("t", lambda q: seen.append("late")))
    bus.publish("t", None)
    assert seen == []
