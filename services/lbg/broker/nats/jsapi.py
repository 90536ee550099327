"""A thin layer over the raw `$JS.API` requests that nats-py does not cover (priority groups).

nats-py 2.16 drops the consumer fields `priority_groups`, `priority_policy` and
`priority_timeout`, and has no UNPIN or RESET: these requests are sent as plain JSON.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import re
from typing import Any

import orjson
from nats.aio.client import Client

API_TIMEOUT = 5.0
NANOS = 1_000_000_000
NO_MESSAGE = 10037
# pinned_client priority groups came in 2.11 and CONSUMER.RESET in 2.14. An older server
# accepts the consumers but drops their priority fields, so every pull would just time out.
MIN_SERVER_VERSION = (2, 14)
_VERSION = re.compile(r"v?(\d+)\.(\d+)")


class JsApiError(Exception):
    """A `$JS.API` request answered with an error; keeps the server's code and description."""

    def __init__(self, subject: str, code: int, err_code: int, description: str) -> None:
        super().__init__(f"{description} (code {code}/{err_code})")
        self.subject = subject
        self.code = code
        self.err_code = err_code
        self.description = description


def server_too_old(version: str) -> bool:
    """Whether a server's INFO `version` predates what the pattern needs (unparsed: let it try)."""
    found = _VERSION.match(version)
    return found is not None and (int(found[1]), int(found[2])) < MIN_SERVER_VERSION


def nanos(seconds: float) -> int:
    """Durations in the JetStream API are integer nanoseconds."""
    return int(seconds * NANOS)


async def request(
    nc: Client, subject: str, payload: dict[str, Any] | None = None, timeout: float = API_TIMEOUT
) -> dict:
    """Send one API request and return its JSON answer, raising JsApiError on an error reply."""
    body = orjson.dumps(payload) if payload is not None else b""
    reply = await nc.request(subject, body, timeout=timeout)
    answer = orjson.loads(reply.data) if reply.data else {}
    error = answer.get("error")
    if error:
        raise JsApiError(
            subject, error.get("code", 0), error.get("err_code", 0), error.get("description", "")
        )
    return answer


def pinned_consumer_config(
    name: str,
    filter_subjects: list[str],
    group: str | None,
    priority_timeout: float,
    max_ack_pending: int,
    ack_wait: float,
    replicas: int = 1,
    start: int | None = None,
) -> dict[str, Any]:
    """A durable pull consumer, from stream sequence `start` if given; with `group`, a
    pinned_client priority group makes it exclusive and its acks cumulative (AckPolicy all:
    only its one owner acks, so one ack can stand for every delivery below it); competing
    consumers ack each message."""
    config: dict[str, Any] = {
        "durable_name": name,
        "ack_policy": "explicit" if group is None else "all",
        "deliver_policy": "all" if start is None else "by_start_sequence",
        "ack_wait": nanos(ack_wait),
        "max_ack_pending": max_ack_pending,
        "filter_subjects": filter_subjects,
        "num_replicas": replicas,
    }
    if start is not None:
        config["opt_start_seq"] = start
    if group is not None:
        config |= {
            "priority_groups": [group],
            "priority_policy": "pinned_client",
            "priority_timeout": nanos(priority_timeout),
        }
    return config


async def create_consumer(nc: Client, stream: str, config: dict[str, Any]) -> dict:
    """Create a durable consumer on `stream`; fails if one exists with another config."""
    subject = f"$JS.API.CONSUMER.CREATE.{stream}.{config['durable_name']}"
    return await request(nc, subject, {"stream_name": stream, "config": config})


async def consumer_info(nc: Client, stream: str, consumer: str) -> dict:
    """The consumer's state: pending, ack pending, the pinned client of its priority group."""
    return await request(nc, f"$JS.API.CONSUMER.INFO.{stream}.{consumer}")


async def consumer_infos(nc: Client, stream: str, timeout: float = API_TIMEOUT) -> list[dict]:
    """Every consumer's state on `stream`, one request per page (the server's limit, 256)."""
    infos: list[dict] = []
    subject = f"$JS.API.CONSUMER.LIST.{stream}"
    while True:
        page = await request(nc, subject, {"offset": len(infos)}, timeout)
        consumers = page.get("consumers") or []
        infos += consumers
        if not consumers or len(infos) >= page.get("total", 0):
            return infos


async def unpin(nc: Client, stream: str, consumer: str, group: str) -> dict:
    """Release the pin so a waiting standby pull becomes the active one at once."""
    return await request(nc, f"$JS.API.CONSUMER.UNPIN.{stream}.{consumer}", {"group": group})


async def reset(nc: Client, stream: str, consumer: str) -> dict:
    """Rewind delivery to the ack floor + 1 and clear pending state (server 2.14+)."""
    return await request(nc, f"$JS.API.CONSUMER.RESET.{stream}.{consumer}")


def next_subject(stream: str, consumer: str) -> str:
    """Where pull requests for a consumer are sent."""
    return f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"


def stored_time(text: str) -> float:
    """Epoch seconds of a message's `time` (RFC 3339 in UTC, up to nanoseconds), which
    `datetime` alone cannot parse past microseconds."""
    whole, _, fraction = text.removesuffix("Z").partition(".")
    moment = datetime.datetime.fromisoformat(whole).replace(tzinfo=datetime.UTC)
    return moment.timestamp() + float(f"0.{fraction or 0}")


async def first_stored_after(
    nc: Client, stream: str, seq: int, subjects: list[str]
) -> float | None:
    """When the first message from `seq` on in any of `subjects` was stored (epoch seconds);
    None if there is none. One STREAM.MSG.GET per subject, since `next_by_subj` takes one."""

    async def first(subject: str) -> tuple[int, float] | None:
        try:
            answer = await request(
                nc, f"$JS.API.STREAM.MSG.GET.{stream}", {"seq": seq, "next_by_subj": subject}
            )
        except JsApiError as exc:
            if exc.err_code == NO_MESSAGE:
                return None
            raise
        message = answer["message"]
        return int(message["seq"]), stored_time(message["time"])

    found = [hit for hit in await asyncio.gather(*map(first, subjects)) if hit is not None]
    return min(found)[1] if found else None


def decode_headers(encoded: str | None) -> dict[str, str]:
    """The headers of a message read with STREAM.MSG.GET (base64 of `NATS/1.0` + lines)."""
    if not encoded:
        return {}
    lines = base64.b64decode(encoded).decode(errors="replace").split("\r\n")[1:]
    pairs = (line.partition(":") for line in lines if ":" in line)
    return {name.strip(): value.strip() for name, _, value in pairs}
