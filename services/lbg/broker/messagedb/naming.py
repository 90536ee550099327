"""How a group maps onto Message DB: categories, stream names, cardinal ids, keys.

Per group `<g>` with hash prefix `<HP>` (a '-' in a name becomes '~': Message DB's category
ends at the first '-'):
- events: category `lbg:<HP>`, one stream per key `lbg:<HP>-<cardinal>+<key>`. The cardinal id
  is what Message DB's consumer-group SQL hashes, so it is chosen to make that SQL select the
  member the publisher's bucket stripes to: with HF messagedb it is the key's own cardinal id;
  with any other HF it is a tag whose Message DB hash is congruent to the bucket modulo
  lcm(HC, QC). Either way member = bucket mod QC (with HF messagedb only if QC divides HC).
- positions: `lbg:<HP>:position-<member>`, as Message DB consumers record theirs;
- output (validation records, dead letters, summaries): streams `lbgout:<g>-<kind>`;
- the config (the JNDI analogue): stream `lbgconfig-<g>`, its last message the current one.

A group over an existing category (CA) reads that category instead of `lbg:<HP>`, and its
publisher writes `<CA>-<key>`: member = abs(hash_64(cardinal id)) mod QC, Message DB's own
consumer-group rule, and its bucket mod QC since QC divides HC. Its positions, locks, output
and config keep the names above (by HP and group name), so they never meet a Message DB
consumer's own `<CA>:position-...` streams.

A delivered event's key is read back from its stream name: the stream's id, less the cardinal
id and its '+' in an `lbg:` category.
"""

from __future__ import annotations

import functools
import hashlib
import math

from lbg.model.destinations import OutputKind
from lbg.model.group import GroupConfig
from lbg.model.hashing import messagedb_bucket

CONFIG_CATEGORY = "lbgconfig"
EVENT_PREFIX = "lbg:"
OUTPUT_PREFIX = "lbgout:"
MAX_GROUP_SIZE = 32767  # get_category_messages casts the group size to smallint
MAX_TAG_MODULUS = 200_000  # bounds the search for bucket tags to a few seconds


class LayoutError(ValueError):
    """A group Message DB consumer groups cannot serve; the message names the field."""


def _safe(name: str) -> str:
    return name.replace("-", "~")


def tag_modulus(config: GroupConfig) -> int:
    """What a bucket tag's hash must be congruent to its bucket modulo: lcm(HC, QC), so that
    it also gives bucket mod QC."""
    return math.lcm(config.hash_count, config.queue_count)


def check_layout(config: GroupConfig) -> None:
    """Refuse a group whose queues could not be Message DB consumer-group members."""
    if config.hash_function == "messagedb" and config.hash_count % config.queue_count:
        raise LayoutError(
            f"HC (hash count) {config.hash_count} is not a multiple of QC (queue count) "
            f"{config.queue_count}: with HF messagedb, Message DB reads a key's stream from "
            "member hash mod QC, which is its queue only if QC divides HC"
        )
    if config.hash_function != "messagedb" and tag_modulus(config) > MAX_TAG_MODULUS:
        raise LayoutError(
            f"HC (hash count) {config.hash_count} and QC (queue count) {config.queue_count}: "
            f"their least common multiple exceeds {MAX_TAG_MODULUS} (choose QC dividing HC)"
        )
    if config.category is not None and _is_ours(config.category):
        raise LayoutError(
            f"CA (category) '{config.category}' is where the groups keep their own streams "
            f"(categories {EVENT_PREFIX}..., {OUTPUT_PREFIX}..., {CONFIG_CATEGORY})"
        )
    if config.queue_count > MAX_GROUP_SIZE:
        raise LayoutError(
            f"QC (queue count) {config.queue_count} exceeds {MAX_GROUP_SIZE}, the largest "
            "Message DB consumer group"
        )


def _is_ours(category: str) -> bool:
    return category == CONFIG_CATEGORY or category.startswith((EVENT_PREFIX, OUTPUT_PREFIX))


def event_category(hash_prefix: str) -> str:
    return f"{EVENT_PREFIX}{_safe(hash_prefix)}"


def source_category(config: GroupConfig) -> str:
    """The category a group's queues read: its CA, else its own `lbg:<HP>`."""
    return config.category if config.category is not None else event_category(config.hash_prefix)


def position_category(hash_prefix: str) -> str:
    return f"{event_category(hash_prefix)}:position"


def position_stream(hash_prefix: str, member: int) -> str:
    return f"{position_category(hash_prefix)}-{member}"


def output_category(group: str) -> str:
    return f"{OUTPUT_PREFIX}{_safe(group)}"


def output_stream(group: str, kind: OutputKind) -> str:
    return f"{output_category(group)}-{kind.value}"


def config_stream(group: str) -> str:
    return f"{CONFIG_CATEGORY}-{group}"


def group_of_config_stream(stream_name: str) -> str:
    return stream_name.partition("-")[2]


@functools.lru_cache(maxsize=8)
def bucket_tags(hash_count: int, modulus: int) -> tuple[str, ...]:
    """For each bucket b, the first of `t0`, `t1`, ... whose Message DB hash is b mod
    `modulus` (a multiple of HC)."""
    tags: list[str | None] = [None] * hash_count
    missing = hash_count
    candidate = 0
    while missing:
        tag = f"t{candidate}"
        residue = messagedb_bucket(f"x-{tag}", modulus)
        if residue < hash_count and tags[residue] is None:
            tags[residue] = tag
            missing -= 1
        candidate += 1
    return tuple(tag for tag in tags if tag is not None)


def cardinal_id(config: GroupConfig, bucket: int, key: str) -> str:
    """The cardinal id that puts `key` (in `bucket`) on member bucket mod QC."""
    if config.hash_function == "messagedb":
        return key.partition("-")[2].partition("+")[0]
    return bucket_tags(config.hash_count, tag_modulus(config))[bucket]


def event_stream(config: GroupConfig, bucket: int, key: str) -> str:
    """The stream an event of `key` goes to: `<CA>-<key>`, or `lbg:<HP>-<cardinal>+<key>`."""
    if config.category is not None:
        return f"{config.category}-{key}"
    return f"{event_category(config.hash_prefix)}-{cardinal_id(config, bucket, key)}+{key}"


def key_of_stream(stream_name: str) -> str:
    """An event's key from its stream name: the id (everything after the first '-'); in an
    `lbg:` category the part of it after the cardinal id's '+', if it has one."""
    category, _, stream_id = stream_name.partition("-")
    if category.startswith(EVENT_PREFIX):
        _, plus, key = stream_id.partition("+")
        return key if plus else stream_id
    return stream_id


def lock_keys(hash_prefix: str, member: int) -> tuple[int, int]:
    """The two int4 keys of a member's session advisory lock (kept apart from Message DB's
    own one-bigint write locks, which live in another key space)."""
    digest = hashlib.md5(event_category(hash_prefix).encode(), usedforsecurity=False).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF, member
