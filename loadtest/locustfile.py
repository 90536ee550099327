"""Locust: storefront sessions publishing order events to a group, with a Black Friday peak.

Each user plays shoppers one order at a time (created, quantity changes, paid, shipped; every
order a fresh key, its events numbered 1, 2, 3, ...) and waits for each broker ack before
the next event. Publish-to-ack latency goes to Locust through `events.request.fire`.

Locust runs on gevent, the broker adapter on asyncio, and the two must not share a process:
every Locust process starts one `ack_publisher.py` child and sends it the events over a pipe
(see that file). The peak shape ramps up, holds the peak and ramps down; its knobs are the
extra command-line options below.
"""

from __future__ import annotations

import itertools
import math
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import gevent
import orjson
from gevent.event import AsyncResult
from locust import LoadTestShape, User, constant_throughput, events, task
from locust.env import Environment

ACK_TIMEOUT = 30.0
READY_TIMEOUT = 30.0
CLOSE_TIMEOUT = 30.0
REQUEST_TYPE = "publish"


@events.init_command_line_parser.add_listener
def add_options(parser: Any) -> None:
    """The broker, the group and the peak's shape."""
    parser.add_argument("--broker-url", default="nats://127.0.0.1:4222", help="Broker URL.")
    parser.add_argument("--group", default="peak", help="Group to publish to.")
    parser.add_argument("--peak-users", type=int, default=50, help="Users at the peak.")
    parser.add_argument("--ramp-seconds", type=float, default=20.0, help="Ramp up (and down).")
    parser.add_argument("--hold-seconds", type=float, default=30.0, help="Time at the peak.")
    parser.add_argument("--user-rate", type=float, default=20.0, help="Events/s per user.")


class AckPublisherProcess:
    """The asyncio publisher child of this Locust process, and the acks awaited from it."""

    def __init__(self, broker_url: str, group: str, publisher_id: str) -> None:
        self.publisher_id = publisher_id
        self._ids = itertools.count()
        self._pending: dict[int, AsyncResult] = {}
        self._ready = AsyncResult()
        self._process = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("ack_publisher.py")),
                *("--broker-url", broker_url, "--group", group, "--id", publisher_id),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._reader = gevent.spawn(self._read)
        self._ready.get(timeout=READY_TIMEOUT)

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            answer = orjson.loads(line)
            if "ready" in answer:
                self._ready.set(True)
                continue
            waiting = self._pending.pop(answer["i"], None)
            if waiting is not None:
                waiting.set(answer)
        error = RuntimeError(f"ack publisher exited with status {self._process.wait()}")
        self._ready.set_exception(error)
        for waiting in self._pending.values():
            waiting.set_exception(error)

    def publish(self, key: str, seq: int, data: Any) -> dict[str, Any]:
        """Publish one event and wait for its ack: {"ms": ..., "n": ..., "e": ...}."""
        assert self._process.stdin is not None
        request_id = next(self._ids)
        answer = self._pending[request_id] = AsyncResult()
        self._process.stdin.write(orjson.dumps({"i": request_id, "k": key, "s": seq, "d": data}))
        self._process.stdin.write(b"\n")
        self._process.stdin.flush()
        try:
            return answer.get(timeout=ACK_TIMEOUT)
        finally:
            self._pending.pop(request_id, None)

    def close(self) -> None:
        """End the input: the child publishes its summary and exits."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        self._process.wait(timeout=CLOSE_TIMEOUT)


publisher: AckPublisherProcess | None = None


@events.init.add_listener
def start_publisher(environment: Environment, **_kwargs: Any) -> None:
    """Start the publisher child once, before the peak. Not on test_start: the runner counts
    as started only once test_start's listeners return, and until then every tick of the
    shape kills the start and fires test_start again; a child slower than a tick to become
    ready (a busy machine) was abandoned and a new one started, over and over, and Locust
    published nothing."""
    global publisher
    options = environment.parsed_options
    publisher_id = f"locust-{uuid.uuid4().hex[:8]}"
    publisher = AckPublisherProcess(options.broker_url, options.group, publisher_id)


@events.test_stop.add_listener
def stop_publisher(environment: Environment, **_kwargs: Any) -> None:
    if publisher is not None:
        publisher.close()


def order_events() -> list[tuple[str, dict[str, Any]]]:
    """One shopper's order: created, 0-3 quantity changes, paid, and usually shipped."""
    sku = f"sku-{random.randrange(2000):05d}"
    steps = [("order_created", {"sku": sku, "quantity": random.randint(1, 3)})]
    steps += [
        ("quantity_changed", {"sku": sku, "quantity": random.randint(1, 10)})
        for _ in range(random.randint(0, 3))
    ]
    steps.append(("paid", {"amount_cents": random.randrange(499, 99_999)}))
    if random.random() < 0.8:
        steps.append(("shipped", {}))
    return steps


class StorefrontPublisher(User):
    """A stream of shoppers' orders; each event waits for the broker's ack before the next."""

    _numbers = itertools.count()

    def wait_time(self) -> float:
        return constant_throughput(self.environment.parsed_options.user_rate)(self)

    def on_start(self) -> None:
        self._prefix = f"{uuid.uuid4().hex[:8]}-u{next(self._numbers)}"
        self._orders = itertools.count()
        self._next_order()

    def _next_order(self) -> None:
        self._key = f"{self._prefix}/o{next(self._orders)}"
        self._steps = order_events()
        self._seq = 0

    @task
    def publish_event(self) -> None:
        assert publisher is not None
        name, data = self._steps[self._seq]
        try:
            answer = publisher.publish(self._key, self._seq + 1, {"event_type": name, **data})
        except (gevent.Timeout, RuntimeError) as exc:
            answer = {"ms": ACK_TIMEOUT * 1000.0, "n": 0, "e": str(exc) or type(exc).__name__}
        self.environment.events.request.fire(
            request_type=REQUEST_TYPE,
            name=name,
            response_time=answer["ms"],
            response_length=answer["n"],
            exception=RuntimeError(answer["e"]) if answer["e"] else None,
            context={"key": self._key},
        )
        if answer["e"]:
            return
        self._seq += 1
        if self._seq == len(self._steps):
            self._next_order()


class PeakShape(LoadTestShape):
    """Ramp up to the peak, hold it, ramp down, stop (--peak-users, --ramp/--hold-seconds)."""

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options
        ramp, hold, peak = options.ramp_seconds, options.hold_seconds, options.peak_users
        spawn_rate = max(1.0, peak / ramp) if ramp > 0 else float(peak)
        elapsed = self.get_run_time()
        if elapsed < ramp:
            return max(1, math.ceil(peak * elapsed / ramp)), spawn_rate
        if elapsed < ramp + hold:
            return peak, spawn_rate
        if elapsed < 2 * ramp + hold:
            return max(1, math.ceil(peak * (2 * ramp + hold - elapsed) / ramp)), spawn_rate
        return None
