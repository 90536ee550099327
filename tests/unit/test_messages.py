"""lbg.model.messages: events carry the producer's body untouched with our metadata in headers, the
group's records round-trip, and everything bad is a MalformedMessage with a reason."""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.model.messages import (
    MAX_KEY_BYTES,
    MAX_MESSAGE_BYTES,
    SEQ_HEADER,
    SUMMARY_CHUNK_BYTES,
    TIME_HEADER,
    Event,
    MalformedMessage,
    Processed,
    dead_letter_headers,
    decode_processed,
    decode_summary,
    encode_processed,
    encode_summaries,
    event_headers,
    read_dead_letter,
    read_event,
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


header_maps = st.dictionaries(
    st.text(alphabet=st.characters(codec="ascii", categories=["L", "N"]), min_size=1, max_size=8),
    st.text(max_size=20),
    max_size=4,
)


@given(key=keys, seq=seqs, payload=st.binary(max_size=300), ts=publish_times, own=header_maps)
def test_an_event_keeps_its_body_and_headers_and_reads_our_metadata(
    key: str, seq: int, payload: bytes, ts: float | None, own: dict[str, str]
) -> None:
    headers = own if ts is None else event_headers(seq, ts, own)
    event = read_event(key, payload, headers)
    assert (event.key, event.body, event.headers) == (key, payload, headers)
    if ts is None:
        assert (event.seq, event.ts) == (None, None)
    else:
        assert event.seq == seq
        assert event.ts == pytest.approx(ts, abs=1e-6)


def test_an_event_from_another_producer_has_no_sequence() -> None:
    event = read_event("order-1", b'{"order_id": "order-1", "step": 1}', {"trace": "x"})
    assert (event.seq, event.ts) == (None, None)
    assert event.json() == {"order_id": "order-1", "step": 1}
    assert event.text() == '{"order_id": "order-1", "step": 1}'


def test_json_and_text_of_a_body_that_is_neither_say_why() -> None:
    event = Event("k", b"\xff\x00 protobuf")
    with pytest.raises(MalformedMessage, match="not valid JSON"):
        event.json()
    with pytest.raises(MalformedMessage, match="not UTF-8"):
        event.text()


@given(
    key=keys,
    seq=st.none() | seqs,
    client=st.text(),
    queue=st.integers(min_value=0, max_value=10**6),
    bucket=st.integers(min_value=0, max_value=10**6),
    redelivered=st.booleans(),
    published_at=publish_times,
)
def test_processed_round_trip(
    key: str,
    seq: int | None,
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


# --- read_event errors ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "headers", "reason"),
    [
        pytest.param("a", {SEQ_HEADER: "0"}, "must be an integer >= 1, got '0'", id="seq-zero"),
        pytest.param("a", {SEQ_HEADER: "-5"}, "Lbg-Seq header must be an integer", id="seq-neg"),
        pytest.param("a", {SEQ_HEADER: "1.0"}, "Lbg-Seq header must be an integer", id="seq-f"),
        pytest.param("a", {SEQ_HEADER: "one"}, "Lbg-Seq header must be an integer", id="seq-word"),
        pytest.param("a", {SEQ_HEADER: "\u0661"}, "Lbg-Seq header must be", id="seq-arabic"),
        pytest.param("a", {SEQ_HEADER: ""}, "Lbg-Seq header must be an integer", id="seq-empty"),
        pytest.param("a", {TIME_HEADER: "now"}, "Lbg-Time header must be epoch", id="ts-word"),
        pytest.param("a", {TIME_HEADER: "nan"}, "Lbg-Time header must be epoch", id="ts-nan"),
        pytest.param("a", {TIME_HEADER: "inf"}, "Lbg-Time header must be epoch", id="ts-inf"),
        pytest.param("", {}, "key must not be empty", id="key-empty"),
        pytest.param(
            "é" * (MAX_KEY_BYTES // 2) + "x",
            {},
            f"key of {MAX_KEY_BYTES + 1} bytes exceeds {MAX_KEY_BYTES}",
            id="key-too-long",
        ),
    ],
)
def test_read_event_rejects_with_a_reason(key: str, headers: dict[str, str], reason: str) -> None:
    with pytest.raises(MalformedMessage) as caught:
        read_event(key, b"{}", headers)
    assert reason in str(caught.value)
    assert "\n" not in str(caught.value)


def test_key_of_exactly_the_maximum_length_is_accepted() -> None:
    key = "é" * (MAX_KEY_BYTES // 2)
    assert read_event(key, b"", {}).key == key


def test_oversized_body_is_rejected() -> None:
    raw = b"x" * (MAX_MESSAGE_BYTES + 1)
    with pytest.raises(MalformedMessage, match=rf"{len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}"):
        read_event("a", raw, {})


def test_body_of_exactly_the_maximum_size_is_accepted() -> None:
    raw = b"x" * MAX_MESSAGE_BYTES
    assert read_event("a", raw, {}).body == raw


@given(
    key=keys,
    seq=seqs,
    own=header_maps,
    reason=st.text(max_size=800),
    subject=st.text(max_size=50),
)
def test_a_dead_letter_names_its_key_and_sequence_and_keeps_the_event_headers(
    key: str, seq: int, own: dict[str, str], reason: str, subject: str
) -> None:
    original = event_headers(seq, 1.5, own)
    headers = dead_letter_headers(original, reason, subject, key, client="c-1", queue="3")
    assert read_dead_letter(headers) == (key, seq)
    assert headers["Lbg-Client"] == "c-1"
    assert headers["Lbg-Queue"] == "3"
    assert all(headers[name] == value for name, value in own.items() if not name.startswith("Lbg"))
    assert "\n" not in headers["Lbg-Reason"]
    assert len(headers["Lbg-Reason"]) <= 500
    assert headers["Lbg-Key"].isascii()


def test_a_dead_letter_without_a_key_or_sequence_is_not_counted_as_an_event() -> None:
    assert read_dead_letter(dead_letter_headers({}, "bad", "x", None)) is None
    assert read_dead_letter(dead_letter_headers({}, "bad", "x", "k")) is None


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

DECODERS = [decode_processed, decode_summary]


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


@settings(max_examples=300)
@given(key=st.text(max_size=80), raw=st.binary(max_size=200), headers=header_maps)
def test_arbitrary_events_raise_only_malformed_message(
    key: str, raw: bytes, headers: dict[str, str]
) -> None:
    for names in ({}, {SEQ_HEADER: "x"}, {TIME_HEADER: "y"}):
        try:
            read_event(key, raw, {**headers, **names})
        except MalformedMessage as exc:
            assert str(exc), "a dead-letter reason must not be empty"
