"""Fuzzing the wire format beyond test_messages.py: corrupted encodings, invalid UTF-8 inside
strings, wrong-typed or huge key/seq/ts, deep nesting, oversized bodies, hostile metadata
headers and topics. Everything bad must give a MalformedMessage whose reason is one short line
(it becomes a dead-letter header)."""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.model.messages import (
    MAX_MESSAGE_BYTES,
    SEQ_HEADER,
    TIME_HEADER,
    MalformedMessage,
    Processed,
    decode_processed,
    decode_summary,
    encode_processed,
    encode_summaries,
    read_event,
)

DECODERS = [decode_processed, decode_summary]
MAX_REASON = 200

# Byte sequences that are not UTF-8: stray continuation, overlong, truncated, UTF-16
# surrogates encoded as UTF-8, above U+10FFFF, and bytes UTF-8 never uses.
INVALID_UTF8 = [
    b"\x80",
    b"\xbf\x80",
    b"\xc0\x80",
    b"\xc1\xbf",
    b"\xe0\x80\x80",
    b"\xe2\x82",
    b"\xf0\x9f\x98",
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xf8\x88\x80\x80\x80",
    b"\xfe",
    b"\xff",
]
LONE_SURROGATES = ["\\ud800", "\\udfff", "\\ud83d x", "\\udc00\\ud800"]


def reason_of(decoder, raw: bytes) -> str | None:
    """Why `decoder` rejects `raw` (checked to be one short line); None if it decodes."""
    try:
        decoder(raw)
    except MalformedMessage as exc:
        reason = str(exc)
        assert reason, "a dead-letter reason must not be empty"
        assert "\n" not in reason and "\r" not in reason, reason
        assert len(reason) <= MAX_REASON, reason
        return reason
    return None


def valid_bodies() -> st.SearchStrategy[tuple[object, bytes]]:
    """A decoder with a body it accepts."""
    processed = st.builds(
        Processed,
        key=st.text(min_size=1, max_size=20),
        seq=st.integers(min_value=1, max_value=1000),
        client=st.text(max_size=10),
        queue=st.integers(min_value=0, max_value=9),
        bucket=st.integers(min_value=0, max_value=99),
    ).map(lambda r: (decode_processed, encode_processed(r)))
    summary = st.dictionaries(
        st.text(min_size=1, max_size=10), st.integers(min_value=1, max_value=99), max_size=4
    ).map(lambda last: (decode_summary, next(encode_summaries("pub", last))))
    return processed | summary


@settings(max_examples=300, deadline=None)
@given(valid=valid_bodies(), data=st.data())
def test_a_corrupted_valid_body_decodes_or_is_malformed_with_a_short_reason(
    valid: tuple[object, bytes], data: st.DataObject
) -> None:
    decoder, body = valid
    assert reason_of(decoder, body) is None
    start = data.draw(st.integers(min_value=0, max_value=len(body)))
    end = data.draw(st.integers(min_value=start, max_value=min(len(body), start + 4)))
    splice = data.draw(st.sampled_from(INVALID_UTF8) | st.binary(max_size=4))
    reason_of(decoder, body[:start] + splice + body[end:])


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("bad", INVALID_UTF8, ids=lambda b: b.hex())
@pytest.mark.parametrize("field", ["k", "d", "t", "p", "c", "nested"])
def test_invalid_utf8_inside_any_json_string_is_malformed(decoder, bad: bytes, field: str) -> None:
    inside = b'"x' + bad + b'y"'
    if field == "nested":
        raw = b'{"k":"a","s":1,"d":{"l":["ok",' + inside + b"]}}"
    else:
        raw = b'{"k":"a","s":1,"c":"c","q":0,"b":0,"p":"p","l":{},"i":0,"n":1,"%s":%s}' % (
            field.encode(),
            inside,
        )
    reason = reason_of(decoder, raw)
    assert reason is not None and "not valid JSON" in reason, reason


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("surrogate", LONE_SURROGATES)
def test_lone_surrogate_escapes_are_malformed(decoder, surrogate: str) -> None:
    raw = b'{"k":"a%s","s":1,"c":"c","q":0,"b":0,"p":"p","l":{"x%s":1},"i":0,"n":1}' % (
        surrogate.encode(),
        surrogate.encode(),
    )
    assert reason_of(decoder, raw) is not None


WRONG_VALUES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**200), max_value=0)
    | st.floats()
    | st.text(max_size=3000)
    | st.lists(st.integers(), max_size=600)
    | st.dictionaries(st.text(max_size=5), st.text(max_size=200), max_size=20)
)


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["k", "s", "t"]), value=WRONG_VALUES)
def test_wrong_typed_or_huge_key_seq_or_ts_is_named_in_a_short_reason(
    field: str, value: object
) -> None:
    document = {"k": "a", "s": 1, "c": "c", "q": 0, "b": 0} | {field: value}
    if field == "k" and isinstance(value, str) and value and len(value.encode()) <= 200:
        return  # a usable key
    usable = value is None or (type(value) in (int, float) and abs(value) < float("inf"))
    if field in "st" and value is None:
        return  # no sequence (another producer's event) or no publish time
    if field == "t" and usable:
        return  # a usable publish time
    raw = json.dumps(document, allow_nan=True).encode("utf-8", "surrogatepass")
    reason = reason_of(decode_processed, raw)
    assert reason is not None, document
    named = {"k": "key", "s": "seq", "t": "t must"}[field]
    assert named in reason or "not valid JSON" in reason or "bad processed" in reason, reason


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"[" * 5000 + b"]" * 5000, id="deep-array"),
        pytest.param(b'{"k":"a","s":1,"c":' + b'{"a":' * 3000 + b"1" + b"}" * 3001, id="deep"),
        pytest.param(b'{"k":"a","s":1,"c":' + b"[" * 3000, id="deep-unterminated"),
        pytest.param(b'{"k":' * 200_000, id="wide-garbage"),
    ],
)
def test_deeply_nested_garbage_is_malformed(decoder, raw: bytes) -> None:
    assert reason_of(decoder, raw) is not None


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(
    "raw",
    [
        pytest.param(b"\xff" * (MAX_MESSAGE_BYTES + 1), id="garbage"),
        pytest.param(b'{"k":"a","s":1,"c":"' + b"x" * MAX_MESSAGE_BYTES + b'"}', id="record"),
        pytest.param(b"[" * (MAX_MESSAGE_BYTES + 1), id="nesting"),
    ],
)
def test_oversized_bodies_are_refused_whatever_they_hold(decoder, raw: bytes) -> None:
    reason = reason_of(decoder, raw)
    assert reason == f"message of {len(raw)} bytes exceeds {MAX_MESSAGE_BYTES}"


@pytest.mark.parametrize(
    ("decoder", "raw"),
    [
        (decode_processed, orjson.dumps({"k": "a", "s": 1, "c": "c", "q": 0, "t": "x" * 5000})),
        (decode_processed, orjson.dumps({"k": "a", "s": 1, "c": "c", "q": "9" * 5000, "b": 0})),
        (decode_processed, orjson.dumps({"k": "a", "s": 1, "c": "c", "q": "x" * 4000, "b": 0})),
        (decode_summary, orjson.dumps({"p": "p", "l": {"a": 1}, "i": "x" * 4000, "n": 1})),
    ],
    ids=["processed-ts", "processed-digits", "processed-text", "summary-part"],
)
def test_reasons_quoting_a_huge_value_stay_short(decoder, raw: bytes) -> None:
    assert reason_of(decoder, raw) is not None


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from([SEQ_HEADER, TIME_HEADER]), value=st.text(max_size=5000))
def test_hostile_metadata_headers_are_named_in_a_short_reason(name: str, value: str) -> None:
    try:
        event = read_event("a", b"{}", {name: value})
    except MalformedMessage as exc:
        reason = str(exc)
        assert name in reason, reason
        assert "\n" not in reason and len(reason) <= MAX_REASON, reason
    else:
        assert event.seq is not None or event.ts is not None
