"""A user's handler for the tests: records every event it is given, byte for byte, with who
processed it and when, one JSON line per event in $LBG_TEST_RECORD_DIR/<client>.jsonl."""

from __future__ import annotations

import base64
import os
import time
from pathlib import Path
from typing import BinaryIO

import orjson

from lbg import Context, Event

_files: dict[str, BinaryIO] = {}


async def record(event: Event, context: Context) -> None:
    """Append the event (key, body, headers) and its processing (client, queue, time)."""
    out = _files.get(context.client)
    if out is None:
        path = Path(os.environ["LBG_TEST_RECORD_DIR"]) / f"{context.client}.jsonl"
        out = _files[context.client] = path.open("ab", buffering=0)
    line = {
        "t": time.time(),
        "key": event.key,
        "body": base64.b64encode(event.body).decode(),
        "headers": dict(event.headers),
        "client": context.client,
        "queue": context.queue,
        "bucket": context.bucket,
    }
    out.write(orjson.dumps(line) + b"\n")


def read_records(folder: Path) -> list[dict]:
    """Every record of every client in `folder`, in the order they were processed."""
    records = []
    for path in folder.glob("*.jsonl"):
        records.extend(orjson.loads(line) for line in path.read_bytes().splitlines() if line)
    for item in records:
        item["body"] = base64.b64decode(item["body"])
    return sorted(records, key=lambda item: item["t"])
