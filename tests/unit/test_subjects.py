"""Event topics: every level becomes exactly one safe token, distinct keys stay apart, and the
key reads back from the topic, also as another producer writes it."""

from urllib.parse import unquote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.broker.base import UndeliverableKey
from lbg.broker.nats.adapter import subject
from lbg.broker.solace.adapter import topic_level, topic_name
from lbg.model.destinations import (
    EventAddress,
    OutputKind,
    event_destination,
    output_destination,
    parse_event_topic,
)
from lbg.model.destinations import level_token as subject_token
from lbg.model.messages import MAX_KEY_BYTES, MalformedMessage, check_key

BLOG_KEYS = [
    "b8c1ccb2-c67f-446f-8111-9eec8b264782/25c151d2-76c3-41aa-98c4-508542cd80b9",
    "0a3c9c0e-5f5a-4c4b-9d53-3b2f0f7e8a11/6d2f1c8e-1b7a-4f3e-8c6d-2a9b0e4d7c55",
]


def assert_one_token(token: str) -> None:
    assert token, "a token must not be empty"
    for forbidden in ".*>":
        assert forbidden not in token, f"{forbidden!r} in {token!r}"
    assert not any(ch.isspace() for ch in token), f"whitespace in {token!r}"
    assert all(ch.isprintable() for ch in token), f"control character in {token!r}"


@pytest.mark.parametrize(
    "key",
    [
        "a.b",
        "a.b.c",
        "*",
        ">",
        "orders.*.>",
        "with space",
        "tab\tand\nnewline",
        "100%",
        "%2E",
        "Grüße",
        "ключ",
        "键",
        "emoji 🎉",
        "a/b/c",
        "..",
        "\x00",
        "\u00a0nbsp",
    ],
)
def test_awkward_keys_become_one_token(key: str) -> None:
    token = subject_token(key)
    assert_one_token(token)
    assert unquote(token) == key


def test_event_subject_has_exactly_three_tokens() -> None:
    target = subject(event_destination("orders", 17, "a.b *>c d"))
    tokens = target.split(".")
    assert len(tokens) == 3
    assert tokens[:2] == ["orders", "17"]
    assert_one_token(tokens[2])


def test_output_subjects() -> None:
    assert subject(output_destination("g1", OutputKind.DEAD)) == "_lbg.g1.dead"
    assert subject(output_destination("g1", OutputKind.VALIDATION)) == "_lbg.g1.validation"
    assert subject(output_destination("g1", OutputKind.SUMMARY)) == "_lbg.g1.summary"


@pytest.mark.parametrize("key", BLOG_KEYS)
def test_blog_uuid_keys_pass_through_unchanged(key: str) -> None:
    assert subject_token(key) == key
    assert subject(event_destination("hash1", 96, key)) == f"hash1.96.{key}"


@pytest.mark.parametrize(
    "keys",
    [
        ("a.b", "a%2Eb", "a%252Eb", "a_b", "a-b", "a b", "a+b", "a/b"),
        ("%", "%25", "%2525"),
        ("é", "%C3%A9", "e\u0301"),
    ],
)
def test_lookalike_keys_get_distinct_tokens(keys: tuple[str, ...]) -> None:
    tokens = [subject_token(k) for k in keys]
    assert len(set(tokens)) == len(keys), dict(zip(keys, tokens, strict=True))


@settings(max_examples=300)
@given(key=st.text(min_size=1))
def test_any_key_is_one_token_that_decodes_back(key: str) -> None:
    token = subject_token(key)
    assert_one_token(token)
    assert unquote(token, errors="strict") == key


@given(keys=st.lists(st.text(min_size=1, max_size=12), min_size=2, max_size=20, unique=True))
def test_distinct_keys_give_distinct_tokens(keys: list[str]) -> None:
    tokens = {subject_token(k) for k in keys}
    assert len(tokens) == len(keys)


@given(
    a=st.text(alphabet="%.2Ee5a *>", min_size=1, max_size=8),
    b=st.text(alphabet="%.2Ee5a *>", min_size=1, max_size=8),
)
def test_injective_on_escape_heavy_text(a: str, b: str) -> None:
    if a != b:
        assert subject_token(a) != subject_token(b)


# nats-server's default max_control_line is 4096 bytes; the publish line also carries the verb,
# a reply inbox and two lengths, so the subject must stay well below it.
SUBJECT_BUDGET = 4096 - 200


@pytest.mark.parametrize("char", ["é", "键", "🎉"])
def test_the_longest_accepted_key_fits_a_nats_control_line(char: str) -> None:
    key = check_key(char * (MAX_KEY_BYTES // len(char.encode())))
    target = subject(event_destination("h" * 40, 99_999, key))
    assert len(target.encode()) <= SUBJECT_BUDGET, f"{len(target.encode())} bytes"


# --- reading the key back from a topic --------------------------------------------------------


@settings(max_examples=300)
@given(key=st.text(min_size=1).filter(lambda k: len(k.encode()) <= MAX_KEY_BYTES))
def test_every_key_reads_back_from_its_nats_and_solace_topic(key: str) -> None:
    destination = event_destination("orders", 17, key)
    assert parse_event_topic(subject(destination), ".") == EventAddress(key, 17)
    try:
        topic = topic_name(destination)
    except UndeliverableKey:
        assert len("/".join(map(topic_level, destination.levels)).encode()) > 250
    else:
        assert parse_event_topic(topic, "/") == EventAddress(key, 17)


@pytest.mark.parametrize(
    ("topic", "separator", "key"),
    [
        ("orders.7.order-1", ".", "order-1"),
        ("orders.7.EU.order-1", ".", "EU.order-1"),
        ("orders.7.EU%2Eorder-1", ".", "EU.order-1"),
        ("orders.7.Grüße/ключ", ".", "Grüße/ключ"),
        ("orders.7.50%25 off", ".", "50% off"),
        ("orders.7.100%", ".", "100%"),
        ("orders/7/EU/order-1", "/", "EU/order-1"),
        ("orders/7/a.b", "/", "a.b"),
    ],
)
def test_a_key_written_by_another_producer_is_read_as_written(
    topic: str, separator: str, key: str
) -> None:
    assert parse_event_topic(topic, separator) == EventAddress(key, 7)


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("orders.7", "has no key level"),
        ("orders.7.", "has no key level"),
        ("orders", "has no key level"),
        ("orders.x7.k", "bucket level 'x7' is no number"),
        ("orders.-1.k", "bucket level '-1' is no number"),
        ("orders.7.%FF%FE", "not UTF-8 once percent-decoded"),
        ("orders.7." + "k" * 201, f"exceeds {MAX_KEY_BYTES}"),
    ],
)
def test_a_topic_without_a_usable_key_is_malformed_with_a_reason(topic: str, reason: str) -> None:
    with pytest.raises(MalformedMessage, match=reason):
        parse_event_topic(topic, ".")


@settings(max_examples=300)
@given(topic=st.text(max_size=300))
def test_any_topic_parses_or_is_malformed(topic: str) -> None:
    try:
        address = parse_event_topic(topic, ".")
    except MalformedMessage as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 300
    else:
        assert address.key and address.bucket is not None and address.bucket >= 0
