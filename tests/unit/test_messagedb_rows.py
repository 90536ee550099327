"""What a Message DB row holds and how it reads back, without a database: PostgreSQL's part
(jsonb normalizing data, jsonb_each_text flattening metadata) is imitated by `_stored`."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.messagedb import rows

text = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]))
headers = st.dictionaries(text, text, max_size=5)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3),
    max_leaves=8,
)


def _jsonb(value: object) -> str:
    """JSON text the way jsonb prints it: spaces after ':' and ','."""
    return json.dumps(value, ensure_ascii=False)


def _stored(message_type: str, data: str | None, metadata: str | None) -> dict[str, object]:
    """A row as `rows.COLUMNS` selects it from what was written."""
    document = None if metadata is None else json.loads(metadata)
    fields = None
    if isinstance(document, dict) and document:
        flat = {k: v if isinstance(v, str) else _jsonb(v) for k, v in document.items()}
        fields = _jsonb(flat)
    stored = None if data is None else _jsonb(json.loads(data))
    return {"type": message_type, "data": stored, "fields": fields}


@given(st.binary(max_size=300), headers)
def test_our_bodies_and_headers_round_trip_byte_for_byte(body: bytes, sent: dict) -> None:
    data, metadata = rows.encode(body, sent, as_json=False)
    assert rows.read_row(_stored("Event", data, metadata)) == (body, sent)


@given(json_values, headers)
def test_our_json_bodies_come_back_as_postgresql_prints_them(value: object, sent: dict) -> None:
    data, metadata = rows.encode(json.dumps(value, separators=(",", ":")).encode(), sent, True)
    body, got = rows.read_row(_stored("Deposited", data, metadata))
    assert json.loads(body) == value and body.decode() == _jsonb(value)
    assert got == sent, "our own row got another writer's headers"


def test_text_bodies_stay_readable_in_the_database() -> None:
    data, metadata = rows.encode(b'{"k":"a"}', {"Lbg-Seq": "1"}, as_json=False)
    assert data == '{"text":"{\\"k\\":\\"a\\"}"}'
    assert json.loads(metadata) == {"lbg": {"body": "text", "headers": {"Lbg-Seq": "1"}}}
    assert "base64" in rows.encode(b"a\x00b", {}, as_json=False)[0]


@given(json_values, st.dictionaries(text.filter(lambda k: k != rows.MARK), json_values))
def test_another_writers_row_is_its_data_text_and_metadata_fields(
    value: object, metadata: dict
) -> None:
    row = _stored("Opened", _jsonb(value), _jsonb(metadata))
    body, got = rows.read_row(row)
    assert body.decode() == row["data"]
    flat = {k: v if isinstance(v, str) else _jsonb(v) for k, v in metadata.items()}
    assert got == {**flat, "Message-Type": "Opened"}


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        '{"lbg": "yes"}',
        '{"lbg": {"body": "text"}}',
        '{"lbg": {"body": "zip", "headers": {}}}',
        '{"lbg": {"body": "base64", "headers": {}}}',
        '{"lbg": {"body": "text", "headers": {"a": 1}}}',
    ],
)
def test_data_that_looks_like_our_wrapper_is_not_unwrapped_without_our_marker(
    metadata: str | None,
) -> None:
    row = _stored("Event", '{"text": "x"}', metadata)
    body, got = rows.read_row(row)
    assert body == b'{"text": "x"}'
    assert got["Message-Type"] == "Event"


def test_metadata_that_is_no_object_gives_only_the_type_and_no_data_gives_no_body() -> None:
    assert rows.read_row(_stored("Noted", None, "[1, 2]")) == (b"", {"Message-Type": "Noted"})


def test_a_body_that_is_not_utf8_cannot_be_shared_category_data() -> None:
    with pytest.raises(rows.BodyNotJson, match="not UTF-8"):
        rows.encode(b"\xff{}", {}, as_json=True)


def test_the_message_type_comes_from_its_header() -> None:
    assert rows.message_type({"Message-Type": "Deposited"}) == "Deposited"
    assert rows.message_type({}) == "Event"
