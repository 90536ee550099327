"""lbg.messages: the shared wire format round-trips, and every bad body is a MalformedMessage."""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.messages import (
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    SUMMARY_CHUNK_BYTES,
    Event,
    MalformedMessage,
    Processed,
    decode_event,
    decode_processed,
    decode_summary,
    encode_event,
    encode_processed,
    encode_summaries,
)

INT64_MAX = 2**63 - 1
BLOG_KEY = "b8c1ccb2-c67f-446f-8111-9eec8b264782/25c151d2-76c3-41aa-98c4-508542cd80b9"

keys = st.text(min_size=1, max_size=MAX_KEY_BYTES // 4)
seqs = st.integers(min_value=1, max_value=INT64_MAX)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-INT64_MAX, max_value=INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def body(**fields: object) -> bytes:
    return orjson.dumps(fields)


# --- round trips -------------------------------------------------------------------------------


publish_times = st.none() | st.floats(min_value=0, max_value=4e9, allow_nan=False)


@given(key=keys, seq=seqs, data=json_values, ts=publish_times)
def test_event_round_trip(key: str, seq: int, data: object, ts: float | None) -> None:
    event = Event(key, seq, data, ts)
    assert decode_event(encode_event(event)) == event


def test_event_round_trip_of_the_blog_key_without_data() -> None:
    event = Event(BLOG_KEY, 1)
    assert decode_event(encode_event(event)) == Event(BLOG_KEY, 1, None)


@given(
    key=keys,
    seq=seqs,
    client=st.text(),
    queue=st.integers(min_value=0, max_value=10**6),
    bucket=st.integers(min_value=0, max_value=10**6),
    redelivered=st.booleans(),
    published_at=publish_times,
)
def test_processed_round_trip(
    key: str,
    seq: int,
    client: str,
    queue: int,
    bucket: int,
    redelivered: bool,
    published_at: float | None,
) -> None:
    record = Processed(key, seq, client, queue, bucket, redelivered, published_at)
    assert decode_processed(encode_processed(record)) == record


@given(
    publisher=st.text(),
    last=st.dictionaries(st.text(min_size=1, max_size=40), seqs, max_size=50),
)
def test_small_summary_is_one_message_that_round_trips(
    publisher: str, last: dict[str, int]
) -> None:
    chunks = list(encode_summaries(publisher, last))
    assert len(chunks) == 1
    summary = decode_summary(chunks[0])
    assert (summary.publisher, summary.last, summary.part, summary.parts) == (publisher, last, 0, 1)


def test_empty_summary_is_one_message() -> None:
    chunks = list(encode_summaries("pub-1", {}))
    assert len(chunks) == 1
    summary = decode_summary(chunks[0])
    assert (summary.publisher, summary.last, summary.part, summary.parts) == ("pub-1", {}, 0, 1)


def test_many_keys_are_split_into_parts_whose_union_is_the_input() -> None:
    last = {f"key-{i}": i % 7 + 1 for i in range(SUMMARY_CHUNK_BYTES // 10)}
    chunks = list(encode_summaries("pub-1", last))
    summaries = [decode_summary(chunk) for chunk in chunks]

    assert len(summaries) > 1
    assert all(len(chunk) <= SUMMARY_CHUNK_BYTES for chunk in chunks)
    assert {s.publisher for s in summaries} == {"pub-1"}
    assert sorted(s.part for s in summaries) == list(range(len(summaries)))
    assert {s.parts for s in summaries} == {len(summaries)}
    assert all(s.last for s in summaries), "no part may be empty"
    union: dict[str, int] = {}
    for summary in summaries:
        assert not union.keys() & summary.last.keys(), "a key is in two parts"
        union |= summary.last
    assert union == last


def test_every_summary_chunk_decodes_even_with_the_longest_keys() -> None:
    last = {f"{i:05d}".ljust(MAX_KEY_BYTES, "k"): 1 for i in range(5000)}
    union: dict[str, int] = {}
    for chunk in encode_summaries("pub-1", last):
        union |= decode_summary(chunk).last
    assert union == last


# --- decode_event errors -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        pytest.param(b"not json", "not valid JSON", id="not-json"),
        pytest.param(b"", "not valid JSON", id="empty"),
        pytest.param(b'{"k": "a", "s": 1', "not valid JSON", id="truncated"),
        pytest.param(b"[1, 2]", "expected a JSON object, got list", id="array"),
        pytest.param(b'"k"', "expected a JSON object, got str", id="string"),
        pytest.param(b"null", "expected a JSON object, got NoneType", id="null"),
        pytest.param(body(s=1), "missing field 'k'", id="no-key"),
        pytest.param(body(k="a"), "missing field 's'", id="no-seq"),
        pytest.param(body(k="a", s="1"), "seq must be an integer, got str", id="seq-str"),
        pytest.param(body(k="a", s=1.0), "seq must be an integer, got float", id="seq-float"),
        pytest.param(body(k="a", s=True), "seq must be an integer, got bool", id="seq-bool"),
        pytest.param(body(k="a", s=None), "seq must be an integer, got NoneType", id="seq-null"),
        pytest.param(body(k="a", s=0), "seq must be >= 1, got 0", id="seq-zero"),
        pytest.param(body(k="a", s=-5), "seq must be >= 1, got -5", id="seq-negative"),
        pytest.param(body(k=7, s=1), "key must be a string, got int", id="key-int"),
        pytest.param(body(k=["a"], s=1), "key must be a string, got list", id="key-list"),
        pytest.param(body(k=None, s=1), "key must be a string, got NoneType", id="key-null"),
        pytest.param(body(k="", s=1), "key must not be empty", id="key-empty"),
        pytest.param(
            body(k="é" * (MAX_KEY_BYTES // 2) + "x", s=1),
            f"key of {MAX_KEY_BYTES + 1} bytes exceeds {MAX_KEY_BYTES}",
            id="key-too-long",
        ),
        pytest.param(b'{"k": "\xff\xfe", "s": 1}', "not valid JSON", id="invalid-utf8-in-key"),
        pytest.param(b"\xc3\x28", "not valid JSON", id="invalid-utf8"),
        pytest.param(b'{"k": "a", "s": 1e400}', "not valid JSON", id="seq-infinite"),
        pytest.param(body(k="a", s=1, t="now"), "t must be a number", id="ts-text"),
        pytest.param(body(k="a", s=1, t=True), "t must be a number", id="ts-bool"),
    ],
)
def test_decode_event_rejects_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(MalformedMessage) as caught:
        decode_event(raw)
    assert reason in str(caught.value)
    assert "\n" not in str(caught.value)


def test_key_of_exactly_the_maximum_length_is_accepted() -> None:
    key = "é" * (MAX_KEY_BYTES // 2)
    assert decode_event(body(k=key, s=1)).key == key


def test_oversized_body_is_rejected_before_parsing() -> None:
    raw = encode_event(Event("a", 1, "x" * MAX_MESSAGE_BYTES))
    assert len(raw) > MAX_MESSAGE_BYTES
    with pytest.raises(MalformedMessage, match=rf"{len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}"):
        decode_event(raw)


def test_body_of_exactly_the_maximum_size_is_accepted() -> None:
    padding = MAX_MESSAGE_BYTES - len(encode_event(Event("a", 1, "")))
    raw = encode_event(Event("a", 1, "x" * padding))
    assert len(raw) == MAX_MESSAGE_BYTES
    assert decode_event(raw) == Event("a", 1, "x" * padding)


def test_extra_fields_are_ignored() -> None:
    assert decode_event(body(k="a", s=3, d=[1], extra="x")) == Event("a", 3, [1])


@pytest.mark.parametrize(
    "raw",
    [
        b"[]",
        body(s=1, c="c", q=0, b=0),
        body(k="a", s=1, q=0, b=0),
        body(k="a", s=1, c="c", q="zero", b=0),
        body(k="a", s=0, c="c", q=0, b=0),
        body(k="a", s=1, c="c", q=0, b=[0]),
    ],
)
def test_decode_processed_rejects_bad_records(raw: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode_processed(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b"{}",
        body(p="x", l=[], i=0, n=1),
        body(p="x", l={"a": 0}, i=0, n=1),
        body(p="x", l={"": 1}, i=0, n=1),
        body(p="x", l={"a": 1}, n=1),
        body(p="x", l={"a": 1}, i=0, n="many"),
    ],
)
def test_decode_summary_rejects_bad_chunks(raw: bytes) -> None:
    with pytest.raises(MalformedMessage):
        decode_summary(raw)


# --- fuzzing: nothing but MalformedMessage escapes ----------------------------------------------

DECODERS = [decode_event, decode_processed, decode_summary]


def decodes_or_malformed(decoder, raw: bytes) -> None:
    try:
        decoder(raw)
    except MalformedMessage as exc:
        assert str(exc), "a dead-letter reason must not be empty"


@pytest.mark.parametrize("decoder", DECODERS)
@settings(max_examples=300)
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_raise_only_malformed_message(decoder, raw: bytes) -> None:
    decodes_or_malformed(decoder, raw)


# Objects shaped like each record, with every field an arbitrary JSON value (or missing).
_FIELD = st.none() | json_values
record_shapes = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={"k": _FIELD, "s": _FIELD, "d": _FIELD}),
    st.fixed_dictionaries({}, optional={f: _FIELD for f in ("k", "s", "c", "q", "b", "r")}),
    st.fixed_dictionaries(
        {},
        optional={
            "p": _FIELD,
            "l": st.dictionaries(st.text(max_size=4), _FIELD, max_size=3) | _FIELD,
            "i": _FIELD,
            "n": _FIELD,
        },
    ),
)


@pytest.mark.parametrize("decoder", DECODERS)
@settings(max_examples=150)
@given(value=record_shapes)
def test_arbitrary_json_raises_only_malformed_message(decoder, value: object) -> None:
    decodes_or_malformed(decoder, orjson.dumps(value))
