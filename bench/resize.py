"""How long each bucket pauses while a NATS JetStream group is resized under load.

A steady publisher feeds a group of running dynamic clients; `cg-admin resize`'s work
(`lbg.admin.resize.resize_group`) changes its queue count through a list of sizes, a few
seconds apart. Every validation record carries its event's publish time (the publisher's
clock) and its store time in the output stream (`OutputMessage.at`), so each event's latency
is when the work was done minus when it was published. A bucket's pause at a resize is the
highest latency of its events published from 0.5 s before the resize to `--settle` seconds
after, minus the median latency of the steady state before the first resize: how much later
than usual the bucket's events were processed because of the switch (its old consumer
draining up to the marker, the new one waiting for it, then being pinned).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import click
import uvloop

from lbg.admin.resize import resize_group
from lbg.aio import cancel_and_wait
from lbg.broker.base import OutputMessage
from lbg.model.destinations import OutputKind
from lbg.model.group import GroupConfig
from lbg.model.messages import MalformedMessage, decode_processed
from lbg.validator import Validator
from measure import BenchError, BrokerRun, follow_records, run_per_broker

START_TIMEOUT = 30.0
DRAIN_IDLE = 5.0
WINDOW_BEFORE = 0.5


class Records:
    """The validator, plus (bucket, published, stored) of every validation record."""

    def __init__(self) -> None:
        self.validator = Validator()
        self.events: list[tuple[int, float, float]] = []

    def handle(self, message: OutputMessage) -> None:
        self.validator.handle(message)
        if message.kind is not OutputKind.VALIDATION or message.at is None:
            return
        try:
            record = decode_processed(message.body)
        except MalformedMessage:
            return
        if record.published_at is not None:
            self.events.append((record.bucket, record.published_at, message.at))


def percentile(values: list[float], pct: float) -> float:
    """Nearest rank."""
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))]


def pauses(events: list[tuple[int, float, float]], switches: list[float], settle: float) -> dict:
    """Per resize and bucket, the extra latency of the bucket's events around the switch."""
    steady = [stored - published for _, published, stored in events if published < switches[0]]
    if not steady:
        raise BenchError("no events before the first resize: lengthen --settle")
    baseline = statistics.median(steady)
    found = []
    for switch in switches:
        worst: dict[int, float] = {}
        for bucket, published, stored in events:
            if switch - WINDOW_BEFORE <= published <= switch + settle:
                worst[bucket] = max(worst.get(bucket, 0.0), stored - published - baseline)
        found.extend(worst.values())
    if not found:
        raise BenchError("no events around the resizes")
    return {
        "baseline_latency_s": round(baseline, 4),
        "samples": len(found),
        "p50_s": round(percentile(found, 50), 3),
        "p99_s": round(percentile(found, 99), 3),
        "max_s": round(max(found), 3),
    }


async def scenario(run: BrokerRun, opts: dict[str, Any]) -> dict[str, Any]:
    sizes: list[int] = opts["sizes"]
    broker = await run.connect("bench-resize")
    name = f"resize-{uuid.uuid4().hex[:6]}"
    config = GroupConfig(hash_prefix=name, hash_count=opts["hash_count"], queue_count=sizes[0])
    await broker.create_group(name, config)
    records = Records()
    reader = follow_records(broker, name, records.handle)
    local = run.deployment(name)
    load = os.getloadavg()
    try:
        for i in range(opts["clients"]):
            local.start(f"c{i}", "lbg-client", "--id", f"c{i}")
        publisher = local.start_publisher(
            "pub", "--keys", str(opts["keys"]), "--rate", str(opts["rate"])
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not records.events:
            if time.monotonic() > deadline:
                raise BenchError(f"no record within {START_TIMEOUT:g}s:\n{publisher.log_tail()}")
            await asyncio.sleep(0.1)
        await asyncio.sleep(opts["settle"])
        switches = []
        for size in sizes[1:]:
            switches.append(time.time())
            done, _ = await resize_group(broker, name, size)
            print(
                f"resized {done.before.queue_count} -> {size} at sequence {done.switch_position}",
                file=sys.stderr,
            )
            await asyncio.sleep(opts["settle"])
        publisher.send(15)
        await asyncio.to_thread(publisher.wait, 30)
        while time.monotonic() - records.validator.last_message < DRAIN_IDLE:
            if records.validator.complete:
                break
            await asyncio.sleep(0.2)
        report = records.validator.report()
        result = pauses(records.events, switches, opts["settle"])
    finally:
        await asyncio.to_thread(local.stop_all)
        await cancel_and_wait(reader)
        await broker.delete_group(name)
        await broker.close()
    result |= {
        "sizes": sizes,
        "published": report.published,
        "lost": report.lost,
        "reordered": report.reordered,
        "duplicates": report.duplicates,
        "loadavg_before": [round(x, 1) for x in load],
        "loadavg_after": [round(x, 1) for x in os.getloadavg()],
    }
    return result


@click.command()
@click.option("--sizes", default="4,8,2,6,4", show_default=True, help="QC, then each resize")
@click.option("--rate", default=600, show_default=True)
@click.option("--keys", default=200, show_default=True)
@click.option("--hash-count", default=24, show_default=True)
@click.option("--clients", default=3, show_default=True)
@click.option("--settle", default=6.0, show_default=True, help="seconds before/after resizes")
@click.option("--broker-url", default=None, help="a running nats:// server (default: private)")
def main(**opts: Any) -> None:
    """Per-bucket pause (p50/p99) while a NATS group is resized under load."""
    opts["sizes"] = [int(s) for s in str(opts["sizes"]).split(",")]
    with tempfile.TemporaryDirectory(prefix="bench-resize-") as folder:
        results = uvloop.run(
            run_per_broker(
                ["nats"],
                opts["broker_url"],
                None,
                Path(folder),
                lambda run: scenario(run, opts),
                lambda line: print(line, file=sys.stderr),
            )
        )
    print(json.dumps(results["nats"]))
    if "error" in results["nats"] or results["nats"]["lost"] or results["nats"]["reordered"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
