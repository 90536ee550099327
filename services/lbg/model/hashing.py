"""Key -> bucket hash functions, bit-compatible with the systems this project interoperates with.

Each bucket function maps a key to a bucket in ``range(buckets)`` exactly as the original Java
publisher, Kafka's default partitioner or a Message DB consumer group would.
"""

import functools
import hashlib
import struct
import sys
from collections.abc import Callable, Mapping
from types import MappingProxyType

_MASK32 = 0xFFFFFFFF
BUCKET_CACHE_SIZE = 65536
_MURMUR2_SEED = 0x9747B28C
_MURMUR2_M = 0x5BD1E995
_MURMUR2_R = 24
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"


class HashKeyError(ValueError):
    """A key that a hash function cannot use; the message names the key and why."""


def _to_int32(value: int) -> int:
    """Reinterpret the low 32 bits of ``value`` as a signed 32-bit integer, like a Java int."""
    value &= _MASK32
    return value - 0x1_0000_0000 if value & 0x8000_0000 else value


def _check_buckets(buckets: int) -> None:
    """Reject a bucket count no key could be hashed into."""
    if buckets < 1:
        raise ValueError(f"buckets: must be >= 1, got {buckets}")


def _utf8(key: str, what: str) -> bytes:
    """Encode ``key`` as UTF-8, turning an unencodable key (a lone surrogate) into HashKeyError."""
    try:
        return key.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise HashKeyError(f"{what} {key!r} is not valid UTF-8 text ({exc.reason})") from exc


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: h = 31*h + c over UTF-16 code units, as a signed 32-bit int.

    Characters outside the BMP count as their two surrogate code units, as they do in Java.
    """
    units = memoryview(s.encode(_UTF16_NATIVE, "surrogatepass")).cast("H")
    h = 0
    for unit in units:
        h = (31 * h + unit) & _MASK32
    return _to_int32(h)


def java_bucket(key: str, buckets: int) -> int:
    """The original Java publisher's bucket: ``Math.abs(key.hashCode() % buckets)``.

    Java's remainder truncates toward zero, so its absolute value equals ``abs(hash) % buckets``.
    """
    _check_buckets(buckets)
    return abs(java_string_hash(key)) % buckets


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: 32-bit MurmurHash2 with Kafka's seed, as a signed 32-bit int."""
    length = len(data)
    h = (_MURMUR2_SEED ^ length) & _MASK32
    whole = length // 4
    for k in struct.unpack_from(f"<{whole}I", data):
        k = (k * _MURMUR2_M) & _MASK32
        k ^= k >> _MURMUR2_R
        k = (k * _MURMUR2_M) & _MASK32
        h = ((h * _MURMUR2_M) & _MASK32) ^ k
    tail = data[whole * 4 :]
    if tail:
        h ^= int.from_bytes(tail, "little")
        h = (h * _MURMUR2_M) & _MASK32
    h ^= h >> 13
    h = (h * _MURMUR2_M) & _MASK32
    h ^= h >> 15
    return _to_int32(h)


def murmur2_bucket(key: str, buckets: int) -> int:
    """Kafka's default partitioner for a string key: ``(murmur2(utf8) & 0x7fffffff) % buckets``."""
    _check_buckets(buckets)
    return (murmur2(_utf8(key, "key")) & 0x7FFFFFFF) % buckets


def messagedb_bucket(stream_name: str, buckets: int) -> int:
    """The Message DB consumer-group member for a stream: ``abs(hash_64(cardinal_id)) % buckets``.

    The id is everything after the first '-', the cardinal id its part before the first '+', and
    hash_64 the first 8 bytes of its MD5 read as a big-endian signed 64-bit integer.
    """
    _check_buckets(buckets)
    _, dash, stream_id = stream_name.partition("-")
    if not dash or not stream_id:
        raise HashKeyError(f"stream name {stream_name!r} has no id (expected category-id)")
    cardinal_id = stream_id.partition("+")[0]
    digest = hashlib.md5(_utf8(cardinal_id, "stream id"), usedforsecurity=False).digest()
    hash_64 = int.from_bytes(digest[:8], "big", signed=True)
    return abs(hash_64) % buckets


HASH_FUNCTIONS: Mapping[str, Callable[[str, int], int]] = MappingProxyType(
    {"java": java_bucket, "murmur2": murmur2_bucket, "messagedb": messagedb_bucket}
)


@functools.lru_cache(maxsize=BUCKET_CACHE_SIZE)
def bucket_for(function: str, key: str, buckets: int) -> int:
    """Hash ``key`` into ``range(buckets)`` with the hash function named ``function``
    (remembered for recent keys: every event of a key hashes it again, in Python)."""
    try:
        bucket_function = HASH_FUNCTIONS[function]
    except KeyError:
        choices = ", ".join(HASH_FUNCTIONS)
        raise HashKeyError(f"unknown hash function {function!r} (choose {choices})") from None
    return bucket_function(key, buckets)
