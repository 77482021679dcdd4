"""Tool calls parsed out of model text, and the streaming filter that keeps tool-call markup out of content."""

from __future__ import annotations

import pytest

from orchard.engines.tool_parsing import ParsedOutput, ParsedToolCall, ToolCallStreamFilter, parse_tool_calls

WEATHER = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("plain text", ParsedOutput("plain text")),
        (WEATHER, ParsedOutput(None, (ParsedToolCall("get_weather", '{"city": "Paris"}'),))),
        (
            "Let me check.\n" + WEATHER + "\n" + WEATHER.replace("Paris", "Oslo"),
            ParsedOutput(
                "Let me check.\n\n",
                (ParsedToolCall("get_weather", '{"city": "Paris"}'), ParsedToolCall("get_weather", '{"city": "Oslo"}')),
            ),
        ),
        (  # arguments given as a JSON string, and compact JSON: normalised to json.dumps form
            '<tool_call>{"name":"ls","arguments":"{\\"path\\":\\".\\"}"}</tool_call>',
            ParsedOutput(None, (ParsedToolCall("ls", '{"path": "."}'),)),
        ),
        ('<tool_call>{"name": "ls"}</tool_call> done', ParsedOutput(" done", (ParsedToolCall("ls", "{}"),))),
        ('<tool_call>{"name": "ls", "arguments": {}', ParsedOutput('<tool_call>{"name": "ls", "arguments": {}')),
        ("<tool_call>not json</tool_call>", ParsedOutput("<tool_call>not json</tool_call>")),
        ('<tool_call>{"arguments": {}}</tool_call>', ParsedOutput('<tool_call>{"arguments": {}}</tool_call>')),
        (
            '<tool_call>{"name": "ls", "arguments": [1]}</tool_call>',
            ParsedOutput('<tool_call>{"name": "ls", "arguments": [1]}</tool_call>'),
        ),
        (WEATHER + "<tool_call>{bad</tool_call>", ParsedOutput(WEATHER + "<tool_call>{bad</tool_call>")),
    ],
)
def test_parse_tool_calls(text: str, expected: ParsedOutput) -> None:
    assert parse_tool_calls(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "Hello there, no tools at all.",
        "  \n" + WEATHER,
        "Checking <tool_ca" + "ll> is not a marker yet",
        "Let me check.\n" + WEATHER + " and then some",
        "Broken: <tool_call>{oops</tool_call> trailing",
        "a <tool" + " b",
    ],
)
@pytest.mark.parametrize("piece", [1, 3, 7])
def test_stream_filter_releases_a_prefix_of_the_final_content(text: str, piece: int) -> None:
    stream = ToolCallStreamFilter()
    released = "".join(stream.push(text[i : i + piece]) for i in range(0, len(text), piece))
    parsed = parse_tool_calls(text)
    assert "<tool_call>" not in released
    assert released + stream.finish(parsed.content) == (parsed.content or "")
