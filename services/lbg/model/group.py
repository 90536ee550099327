"""The load-balancing group (LBG) configuration: the JSON document stored under a JNDI name.

It fixes how keys hash into buckets and how buckets stripe over the group's exclusive queues.
"""

import re
from dataclasses import dataclass
from typing import Any, Self

import orjson

from lbg.model.hashing import HASH_FUNCTIONS, bucket_for

MAX_HASH_COUNT = 100_000
# The whole group's spool (QS x QC MB) in bytes must fit a signed 64-bit integer, as brokers
# take it (NATS stream max_bytes, RabbitMQ x-max-length-bytes).
MAX_QUEUE_SIZE_MB = (2**63 - 1) // 2**20
MAX_JSON_LENGTH = 200
MAX_REPLICAS = 5
# A resizable group's generation shares an int4 lock key with its member (Message DB).
MAX_GENERATION = 65535

# The one rule for each name, shared by the group config and the daemons' TOML settings.
GROUP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
GROUP_NAME_RULE = "1-64 characters of [A-Za-z0-9_-] not starting with '-' or '_'"
HASH_PREFIX = re.compile(r"[A-Za-z0-9-][A-Za-z0-9_-]{0,39}")
HASH_PREFIX_RULE = "1-40 characters of [A-Za-z0-9_-] not starting with '_'"
_CLIENT_USERNAME = re.compile(r"[A-Za-z0-9_.@-]{1,32}")
_PLAIN_KEY = re.compile(r"[A-Za-z0-9_]{1,20}")
_CATEGORY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_:+.]{0,63}")
CATEGORY_HASH = "messagedb"

_FIELDS = {
    "HP": "hash prefix",
    "HC": "hash count",
    "QC": "queue count",
    "QS": "queue size MB",
    "CU": "client username",
    "HF": "hash function",
    "EX": "exclusive",
    "RF": "replicas",
    "GN": "size generation",
    "CA": "category",
}
_REQUIRED = ("HP", "HC", "QC")
_DROPPED = frozenset({"CP"})


class GroupConfigError(ValueError):
    """An invalid group configuration; the message always names the offending field."""


def _show(value: object) -> str:
    """A value for an error message: its repr, cut to one short line (stored JSON is untrusted)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _field(code: str) -> str:
    """The field label used in error messages, e.g. ``HC (hash count)``."""
    return f"{code} ({_FIELDS[code]})"


def validate_group_name(name: str) -> str:
    """Return ``name`` if usable as a group name: 1-64 of [A-Za-z0-9_-], not led by '-' or '_'."""
    if not isinstance(name, str) or not GROUP_NAME.fullmatch(name):
        raise GroupConfigError(f"group name: must be {GROUP_NAME_RULE}, got {_show(name)}")
    return name


def _check_int(code: str, value: object, minimum: int) -> None:
    """Require ``value`` to be an int (not a bool) no smaller than ``minimum``."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise GroupConfigError(f"{_field(code)}: must be an integer, got {_show(value)}")
    if value < minimum:
        raise GroupConfigError(f"{_field(code)}: must be >= {minimum}, got {value}")


def _check_text(code: str, value: object, pattern: re.Pattern[str], rule: str) -> None:
    """Require ``value`` to be a string matching ``pattern`` in full."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise GroupConfigError(f"{_field(code)}: must be {rule}, got {_show(value)}")


def _exclusive_from_json(value: object) -> bool:
    """Read EX as stored (0 or 1), also accepting a JSON boolean."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise GroupConfigError(f"{_field('EX')}: must be 0 or 1, got {_show(value)}")


@dataclass(frozen=True)
class GroupConfig:
    """One LBG: keys hash into ``hash_count`` buckets striped over ``queue_count`` queues.

    ``exclusive=False`` selects competing consumers, the documented opt-out from per-key order.
    ``generation`` counts the resizes of a resizable group (Message DB): members compare it in
    their heartbeats to learn that the group has a new size.
    ``category`` (Message DB only) makes the group read an existing category that any writer
    fills, as a Message DB consumer group does: a key is a stream's id there.
    """

    hash_prefix: str
    hash_count: int
    queue_count: int
    queue_size_mb: int = 100
    client_username: str = "lbg-client"
    hash_function: str = "java"
    exclusive: bool = True
    replicas: int = 1
    generation: int = 0
    category: str | None = None

    def __post_init__(self) -> None:
        """Reject any field outside its documented range, naming the field."""
        _check_text(
            "HP",
            self.hash_prefix,
            HASH_PREFIX,
            HASH_PREFIX_RULE,
        )
        _check_int("QC", self.queue_count, 1)
        _check_int("HC", self.hash_count, 1)
        if self.hash_count < self.queue_count:
            raise GroupConfigError(
                f"{_field('HC')}: must be >= QC ({self.queue_count}), got {self.hash_count}"
            )
        if self.hash_count > MAX_HASH_COUNT:
            raise GroupConfigError(
                f"{_field('HC')}: must be <= {MAX_HASH_COUNT}, got {self.hash_count}"
            )
        _check_int("QS", self.queue_size_mb, 1)
        if self.queue_size_mb > MAX_QUEUE_SIZE_MB // self.queue_count:
            raise GroupConfigError(
                f"{_field('QS')}: must be <= {MAX_QUEUE_SIZE_MB // self.queue_count} with QC"
                f" {self.queue_count} (the group's spool in bytes must fit 64 bits),"
                f" got {self.queue_size_mb}"
            )
        _check_text(
            "CU", self.client_username, _CLIENT_USERNAME, "1-32 characters of [A-Za-z0-9_.@-]"
        )
        if not isinstance(self.hash_function, str) or self.hash_function not in HASH_FUNCTIONS:
            choices = ", ".join(HASH_FUNCTIONS)
            raise GroupConfigError(
                f"{_field('HF')}: must be one of {choices}, got {_show(self.hash_function)}"
            )
        if not isinstance(self.exclusive, bool):
            raise GroupConfigError(
                f"{_field('EX')}: must be a boolean, got {_show(self.exclusive)}"
            )
        _check_int("RF", self.replicas, 1)
        if self.replicas > MAX_REPLICAS:
            raise GroupConfigError(
                f"{_field('RF')}: must be <= {MAX_REPLICAS}, got {self.replicas}"
            )
        _check_int("GN", self.generation, 0)
        if self.generation > MAX_GENERATION:
            raise GroupConfigError(
                f"{_field('GN')}: must be <= {MAX_GENERATION}, got {self.generation}"
            )
        if self.category is not None:
            self._check_category()

    def _check_category(self) -> None:
        """A group over a category: a category name, hashed the way Message DB consumer groups
        hash its streams, and a config that still fits its 200 characters."""
        _check_text(
            "CA",
            self.category,
            _CATEGORY,
            "1-64 characters of [A-Za-z0-9_:+.] not starting with ':', '+' or '.'",
        )
        if self.hash_function != CATEGORY_HASH:
            raise GroupConfigError(
                f"{_field('HF')}: must be {CATEGORY_HASH} in a group over a category (CA), as "
                f"Message DB's consumer groups hash its streams, got {_show(self.hash_function)}"
            )
        length = len(orjson.dumps(self._document()))
        if length > MAX_JSON_LENGTH:
            raise GroupConfigError(
                f"{_field('CA')}: with it the config JSON is {length} characters, over the "
                f"{MAX_JSON_LENGTH}-character limit (shorten CA, HP or CU)"
            )

    def to_json(self) -> str:
        """The compact JSON stored in JNDI (HP, HC, QC, QS, CU, HF; EX only when off, RF only
        when replicated, GN only once resized).

        It never holds a password, and must fit the 200-character Solace JNDI physical name; with
        today's field limits it is at most 169 characters without CA (a group with CA is checked
        when it is made), so the check guards future fields.
        """
        text = orjson.dumps(self._document()).decode()
        if len(text) > MAX_JSON_LENGTH:
            raise GroupConfigError(
                f"group config JSON: must fit the {MAX_JSON_LENGTH}-character limit of the Solace"
                f" JNDI physical name, got {len(text)} characters"
            )
        return text

    def _document(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "HP": self.hash_prefix,
            "HC": self.hash_count,
            "QC": self.queue_count,
            "QS": self.queue_size_mb,
            "CU": self.client_username,
            "HF": self.hash_function,
        }
        if not self.exclusive:
            document["EX"] = 0
        if self.replicas != 1:
            document["RF"] = self.replicas
        if self.generation:
            document["GN"] = self.generation
        if self.category is not None:
            document["CA"] = self.category
        return document

    @classmethod
    def from_json(cls, text: str | bytes) -> Self:
        """Parse the stored JSON, including the original form with CP (the password is dropped)."""
        try:
            document = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise GroupConfigError(f"group config JSON: not valid JSON ({exc})") from exc
        if not isinstance(document, dict):
            raise GroupConfigError(
                f"group config JSON: must be a JSON object, got {type(document).__name__}"
            )
        for key in document:
            if key not in _FIELDS and key not in _DROPPED:
                known = ", ".join([*_FIELDS, *sorted(_DROPPED)])
                shown = key if _PLAIN_KEY.fullmatch(key) else _show(key)
                raise GroupConfigError(f"{shown}: unknown key (known keys: {known})")
        for code in _REQUIRED:
            if code not in document:
                raise GroupConfigError(f"{_field(code)}: missing")
        optional: dict[str, Any] = {}
        if "QS" in document:
            optional["queue_size_mb"] = document["QS"]
        if "CU" in document:
            optional["client_username"] = document["CU"]
        if "HF" in document:
            optional["hash_function"] = document["HF"]
        if "EX" in document:
            optional["exclusive"] = _exclusive_from_json(document["EX"])
        if "RF" in document:
            optional["replicas"] = document["RF"]
        if "GN" in document:
            optional["generation"] = document["GN"]
        if "CA" in document:
            optional["category"] = document["CA"]
        return cls(
            hash_prefix=document["HP"],
            hash_count=document["HC"],
            queue_count=document["QC"],
            **optional,
        )

    def buckets_for_queue(self, queue: int) -> list[int]:
        """The buckets striped onto ``queue``: queue, queue + QC, queue + 2*QC, ... below HC."""
        if not 0 <= queue < self.queue_count:
            raise ValueError(f"queue {queue} is outside 0..{self.queue_count - 1}")
        return list(range(queue, self.hash_count, self.queue_count))

    def queue_for_bucket(self, bucket: int) -> int:
        """The queue that carries ``bucket`` (bucket modulo QC)."""
        if not 0 <= bucket < self.hash_count:
            raise ValueError(f"bucket {bucket} is outside 0..{self.hash_count - 1}")
        return bucket % self.queue_count

    def bucket_for_key(self, key: str) -> int:
        """The bucket ``key`` hashes to under this group's hash function and hash count; in a
        group over a category, the key is a stream's id, hashed as the stream `<CA>-<key>`."""
        name = key if self.category is None else f"{self.category}-{key}"
        return bucket_for(self.hash_function, name, self.hash_count)

    def queue_for_key(self, key: str) -> int:
        """The queue that carries ``key``'s events."""
        return self.queue_for_bucket(self.bucket_for_key(key))
