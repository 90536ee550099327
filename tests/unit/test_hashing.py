"""Key -> bucket hashing: published vectors and properties."""

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.model.hashing import (
    HASH_FUNCTIONS,
    HashKeyError,
    bucket_for,
    java_bucket,
    java_string_hash,
    messagedb_bucket,
    murmur2,
    murmur2_bucket,
)

INT_MIN = -(2**31)

# Kafka's UtilsTest.testMurmur2 (tails of 0, 2 and 3 bytes).
KAFKA_MURMUR2 = [
    ("21", -973932308),
    ("foobar", -790332482),
    ("a-little-bit-long-string", -985981536),
    ("a-little-bit-longer-string", -1486304829),
    ("lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    ("abc", 479470107),
]

# Partitions out of 1000 that Kafka's Java default partitioner picks; these also cover a 1-byte
# tail ("a", "123456789") and the empty key.
KAFKA_PARTITIONS_OF_1000 = [
    ("", 681),
    ("a", 524),
    ("ab", 434),
    ("abc", 107),
    ("123456789", 566),
    ("\x00 ", 742),
]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", INT_MIN),
        # One non-BMP char hashes as its surrogate pair: 0xD83D * 31 + 0xDE00.
        ("\U0001f600", 0xD83D * 31 + 0xDE00),
    ],
)
def test_java_string_hash_matches_java(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_java_string_hash_of_non_bmp_char_equals_its_surrogate_pair() -> None:
    assert java_string_hash("\U0001f600") == 1772899
    assert java_string_hash("\U0001f600") == java_string_hash("\ud83d\ude00")


def test_java_bucket_uses_truncating_remainder_then_abs() -> None:
    # Java: Integer.MIN_VALUE % 7 == -2, Math.abs(-2) == 2 (Python's floor modulo would give 5).
    assert java_bucket("polygenelubricants", 7) == 2
    # "hello" hashes positive, so the bucket is a plain remainder.
    assert java_bucket("hello", 100) == 99162322 % 100


@pytest.mark.parametrize(("text", "expected"), KAFKA_MURMUR2)
def test_murmur2_matches_kafka_utils_test(text: str, expected: int) -> None:
    assert murmur2(text.encode()) == expected


@pytest.mark.parametrize(("text", "expected"), KAFKA_PARTITIONS_OF_1000)
def test_murmur2_bucket_matches_kafka_default_partitioner(text: str, expected: int) -> None:
    assert murmur2_bucket(text, 1000) == expected


def test_murmur2_bucket_masks_the_sign_bit() -> None:
    # murmur2("21") is negative; Kafka clears the sign bit instead of taking abs().
    assert murmur2_bucket("21", 1000) == (-973932308 & 0x7FFFFFFF) % 1000


def _reference_messagedb(cardinal_id: str, buckets: int) -> int:
    digest = hashlib.md5(cardinal_id.encode()).digest()
    return abs(int.from_bytes(digest[:8], "big", signed=True)) % buckets


@pytest.mark.parametrize(
    ("stream_name", "cardinal_id"),
    [
        ("account-123", "123"),
        ("account-123+456", "123"),
        ("account:command-123", "123"),
        ("account-a-b", "a-b"),
        ("account-123+456+789", "123"),
    ],
)
def test_messagedb_bucket_hashes_the_cardinal_id(stream_name: str, cardinal_id: str) -> None:
    for buckets in (1, 2, 3, 7, 1000):
        assert messagedb_bucket(stream_name, buckets) == _reference_messagedb(cardinal_id, buckets)


def test_messagedb_bucket_ignores_category_and_compound_part() -> None:
    assert messagedb_bucket("account-123+1", 1000) == messagedb_bucket("other:x-123+2", 1000)


@pytest.mark.parametrize("stream_name", ["account", "account-", ""])
def test_messagedb_bucket_rejects_stream_without_id(stream_name: str) -> None:
    with pytest.raises(HashKeyError, match=f"stream name '{stream_name}' has no id"):
        messagedb_bucket(stream_name, 4)


def test_lone_surrogate_key_is_a_hash_key_error_for_utf8_hashes() -> None:
    with pytest.raises(HashKeyError, match="not valid UTF-8"):
        murmur2_bucket("a\ud800", 4)
    with pytest.raises(HashKeyError, match="not valid UTF-8"):
        messagedb_bucket("account-\ud800", 4)


def test_bucket_for_dispatches_by_name() -> None:
    assert bucket_for("java", "hello", 100) == java_bucket("hello", 100)
    assert bucket_for("murmur2", "abc", 1000) == 107
    assert bucket_for("messagedb", "account-1", 10) == messagedb_bucket("account-1", 10)
    assert set(HASH_FUNCTIONS) == {"java", "murmur2", "messagedb"}


def test_bucket_for_rejects_unknown_function() -> None:
    with pytest.raises(
        HashKeyError, match=r"unknown hash function 'crc32' \(choose java, murmur2, messagedb\)"
    ):
        bucket_for("crc32", "k", 4)


@pytest.mark.parametrize("function", sorted(HASH_FUNCTIONS))
@pytest.mark.parametrize("buckets", [0, -1])
def test_bucket_for_rejects_bucket_count_below_one(function: str, buckets: int) -> None:
    with pytest.raises(ValueError, match="buckets: must be >= 1"):
        bucket_for(function, "account-1", buckets)


def _java_reference(text: str) -> int:
    """String.hashCode computed the slow way: big-int polynomial, then wrapped to 32 bits."""
    data = text.encode("utf-16-be", "surrogatepass")
    units = [int.from_bytes(data[i : i + 2], "big") for i in range(0, len(data), 2)]
    total = sum(unit * 31 ** (len(units) - 1 - i) for i, unit in enumerate(units))
    wrapped = total % 2**32
    return wrapped - 2**32 if wrapped >= 2**31 else wrapped


def _java_remainder(dividend: int, divisor: int) -> int:
    """Java's %, which truncates toward zero."""
    quotient = abs(dividend) // divisor
    return dividend - (quotient if dividend >= 0 else -quotient) * divisor


keys = st.text(max_size=60)
utf8_keys = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=60)
bucket_counts = st.integers(min_value=1, max_value=100_000)


@given(keys)
def test_java_string_hash_agrees_with_reference(text: str) -> None:
    assert java_string_hash(text) == _java_reference(text)


@given(keys, bucket_counts)
def test_java_bucket_agrees_with_reference(text: str, buckets: int) -> None:
    assert java_bucket(text, buckets) == abs(_java_remainder(_java_reference(text), buckets))


@given(utf8_keys, bucket_counts, st.sampled_from(["java", "murmur2"]))
def test_bucket_in_range_and_deterministic(key: str, buckets: int, function: str) -> None:
    bucket = bucket_for(function, key, buckets)
    assert 0 <= bucket < buckets
    assert bucket_for(function, key, buckets) == bucket


@given(utf8_keys.filter(bool).map(lambda s: "cat-" + s), bucket_counts)
def test_messagedb_bucket_in_range_and_deterministic(stream_name: str, buckets: int) -> None:
    bucket = messagedb_bucket(stream_name, buckets)
    assert 0 <= bucket < buckets
    assert messagedb_bucket(stream_name, buckets) == bucket


@given(st.binary(max_size=64))
def test_murmur2_is_a_signed_32_bit_int(data: bytes) -> None:
    assert INT_MIN <= murmur2(data) < 2**31
