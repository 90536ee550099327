"""A group's parking lot on NATS JetStream.

- The registry: the KV bucket `lbg_parked_<group>`, one key per parked key (its name as
  base64url, model/parking.py `token`); listed from the bucket stream's subjects.
- The lot: the stream `LBG_<group>_PARK` over `_lbgpark.<group>.<token>`, one subject per
  parked key, so a key's events are read in order with direct gets (`next_by_subj`) and
  trimmed with a purge of its subject up to a sequence. The stream's sequence is the position.
Both are made by cg-admin with the group; the group's CU may use this group's and no other's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, KeyDeletedError, KeyNotFoundError, NotFoundError
from nats.js.errors import Error as JetStreamError
from nats.js.kv import KeyValue

from lbg.broker.base import BrokerError, ParkedEvent, ParkingLot, why
from lbg.broker.nats.pubacks import NoStream, Rejected, StreamPublisher
from lbg.model.messages import MalformedMessage
from lbg.model.parking import key_of, token

LOT_PREFIX = "_lbgpark"
LOT_MAX_BYTES = 1024**3
# What a direct get adds to a message's own headers.
DIRECT_GET_HEADERS = frozenset(
    {"Nats-Stream", "Nats-Subject", "Nats-Sequence", "Nats-Time-Stamp", "Nats-Num-Pending"}
)


def registry_bucket(group: str) -> str:
    return f"lbg_parked_{group}"


def lot_stream(group: str) -> str:
    return f"LBG_{group}_PARK"


def lot_subject(group: str, key: str) -> str:
    return f"{LOT_PREFIX}.{group}.{token(key)}"


def lot_stream_config(group: str, replicas: int) -> StreamConfig:
    """The lot's stream: durable, ordered per subject, readable with direct gets."""
    return StreamConfig(
        name=lot_stream(group),
        subjects=[f"{LOT_PREFIX}.{group}.*"],
        storage=StorageType.FILE,
        discard=DiscardPolicy.NEW,
        max_bytes=LOT_MAX_BYTES,
        num_replicas=replicas,
        allow_direct=True,
    )


class NatsParkingLot(ParkingLot):
    """One group's registry and lot, through one connection."""

    def __init__(
        self,
        js: JetStreamContext,
        publisher: StreamPublisher,
        group: str,
        refusal: Callable[[str], str | None],
    ) -> None:
        self._js = js
        self._publisher = publisher
        self._group = group
        self._refusal = refusal
        self._kv: KeyValue | None = None

    def _failed(self, what: str, subject: str, exc: Exception) -> BrokerError:
        """One line: what failed, and why (the server's refusal if it refused this user)."""
        return BrokerError(f"{what}: {self._refusal(subject) or why(exc)}")

    async def _registry(self) -> KeyValue:
        if self._kv is None:
            try:
                self._kv = await self._js.key_value(registry_bucket(self._group))
            except (BucketNotFoundError, NotFoundError):
                raise BrokerError(
                    f"group '{self._group}' has no parked-key registry (KV bucket "
                    f"'{registry_bucket(self._group)}'): it was made before parking existed; "
                    "recreate it with cg-admin"
                ) from None
            except (JetStreamError, TimeoutError) as exc:
                subject = f"$JS.API.STREAM.INFO.KV_{registry_bucket(self._group)}"
                raise self._failed(f"group '{self._group}': parked keys", subject, exc) from None
        return self._kv

    async def records(self, current: bool = True) -> dict[str, bytes]:
        kv = await self._registry()
        bucket = registry_bucket(self._group)
        try:
            info = await self._js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.>")
            found = {}
            for subject in info.state.subjects or {}:
                name = subject.removeprefix(f"$KV.{bucket}.")
                with contextlib.suppress(KeyDeletedError, KeyNotFoundError):
                    entry = await kv.get(name)
                    if entry.value:
                        found[key_of(name)] = entry.value
        except (JetStreamError, MalformedMessage, TimeoutError) as exc:
            subject = f"$JS.API.STREAM.INFO.KV_{bucket}"
            raise self._failed(
                f"cannot read the parked keys of '{self._group}'", subject, exc
            ) from None
        return found

    async def put(self, key: str, record: bytes) -> None:
        kv = await self._registry()
        try:
            await kv.put(token(key), record)
        except (JetStreamError, TimeoutError) as exc:
            subject = f"$KV.{registry_bucket(self._group)}.{token(key)}"
            raise self._failed(f"cannot park key {key[:80]!r}", subject, exc) from None

    async def delete(self, key: str) -> None:
        kv = await self._registry()
        try:
            await kv.purge(token(key))
        except (JetStreamError, TimeoutError) as exc:
            subject = f"$KV.{registry_bucket(self._group)}.{token(key)}"
            raise self._failed(f"cannot unpark key {key[:80]!r}", subject, exc) from None

    async def append(self, key: str, body: bytes, headers: Mapping[str, str]) -> None:
        try:
            await self._publisher.publish(lot_subject(self._group, key), body, dict(headers))
        except NoStream:
            raise BrokerError(f"group '{self._group}' has no parking lot stream") from None
        except (TimeoutError, Rejected) as exc:
            subject = lot_subject(self._group, key)
            raise self._failed(f"cannot park an event of {key[:80]!r}", subject, exc) from None

    async def events(self, key: str) -> list[ParkedEvent]:
        subject, found, seq = lot_subject(self._group, key), [], 1
        while True:
            try:
                msg = await self._js.get_msg(
                    lot_stream(self._group), seq=seq, subject=subject, direct=True, next=True
                )
            except NotFoundError:
                return found
            except (JetStreamError, TimeoutError) as exc:
                subject = f"$JS.API.DIRECT.GET.{lot_stream(self._group)}"
                what = f"cannot read the parked events of {key[:80]!r}"
                raise self._failed(what, subject, exc) from None
            headers = {
                name: value
                for name, value in (msg.headers or {}).items()
                if name not in DIRECT_GET_HEADERS
            }
            found.append(ParkedEvent(msg.data or b"", headers, msg.seq or seq))
            seq = (msg.seq or seq) + 1

    async def trim(self, key: str, through: int) -> None:
        try:
            await self._js.purge_stream(
                lot_stream(self._group), seq=through + 1, subject=lot_subject(self._group, key)
            )
        except (JetStreamError, TimeoutError) as exc:
            subject = f"$JS.API.STREAM.PURGE.{lot_stream(self._group)}"
            what = f"cannot trim the parked events of {key[:80]!r}"
            raise self._failed(what, subject, exc) from None
