"""hashed-publisher's JSON-lines input: good records become (key, body), bad ones name their
file:line."""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.model.messages import MAX_KEY_BYTES, MalformedMessage
from lbg.publisher import parse_line

WHERE = "events.jsonl:7"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"key": "a", "data": 1}\n', ("a", b"1")),
        ('{"key": "a"}', ("a", b"")),
        ('  {"data": {"x": [1, 2]}, "key": "k/1"}  \r\n', ("k/1", b'{"x":[1,2]}')),
        ('{"key": "a.b *>", "data": null, "other": true}', ("a.b *>", b"")),
        ('{"key": "Grüße", "data": "é"}', ("Grüße", '"é"'.encode())),
        ('{"key": "a", "body": "plain text, not JSON"}', ("a", b"plain text, not JSON")),
        ('{"key": "a", "body": "é", "data": 1}', ("a", "é".encode())),
        ('{"key": "' + "k" * MAX_KEY_BYTES + '"}', ("k" * MAX_KEY_BYTES, b"")),
    ],
)
def test_good_lines(line: str, expected: tuple[str, bytes]) -> None:
    assert parse_line(line, WHERE) == expected


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param("not json at all", "not a JSON object (expected {", id="not-json"),
        pytest.param('{"key": "a"', "not valid JSON (unexpected end of data at column", id="cut"),
        pytest.param("", "not a JSON object", id="empty"),
        pytest.param('["key", "a"]', '"key" field', id="array"),
        pytest.param('"a"', '"key" field', id="string"),
        pytest.param("null", '"key" field', id="null"),
        pytest.param('{"data": 1}', '"key" field', id="no-key"),
        pytest.param('{"Key": "a"}', '"key" field', id="wrong-case"),
        pytest.param('{"key": 5}', "key must be a string, got int", id="key-int"),
        pytest.param('{"key": null}', "key must be a string, got NoneType", id="key-null"),
        pytest.param('{"key": ["a"]}', "key must be a string, got list", id="key-list"),
        pytest.param('{"key": ""}', "key must not be empty", id="key-empty"),
        pytest.param('{"key": "a", "body": 5}', '"body" must be a string', id="body-int"),
        pytest.param(
            '{"key": "' + "k" * (MAX_KEY_BYTES + 1) + '"}',
            f"exceeds {MAX_KEY_BYTES}",
            id="key-too-long",
        ),
    ],
)
def test_bad_lines_name_file_and_line(line: str, reason: str) -> None:
    with pytest.raises(MalformedMessage) as caught:
        parse_line(line, WHERE)
    message = str(caught.value)
    assert message.startswith(f"{WHERE}: "), message
    assert reason in message
    assert "\n" not in message


_VALUES = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=8)
json_lines = st.builds(
    lambda v: orjson.dumps(v).decode(),
    st.dictionaries(st.sampled_from(["key", "data", "body", "x"]), _VALUES | st.lists(_VALUES))
    | _VALUES,
)


@settings(max_examples=300)
@given(line=st.text(max_size=80) | json_lines)
def test_any_text_parses_or_names_its_line(line: str) -> None:
    try:
        key, body = parse_line(line, WHERE)
    except MalformedMessage as exc:
        assert str(exc).startswith(f"{WHERE}: ")
    else:
        assert isinstance(key, str) and 0 < len(key.encode()) <= MAX_KEY_BYTES
        assert isinstance(body, bytes)


@given(
    key=st.text(min_size=1, max_size=50),
    data=st.none() | st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.text(),
)
def test_serialised_records_parse_back(key: str, data: object) -> None:
    line = orjson.dumps({"key": key, "data": data}).decode()
    parsed_key, body = parse_line(line, WHERE)
    assert parsed_key == key
    assert (orjson.loads(body) if body else None) == data
