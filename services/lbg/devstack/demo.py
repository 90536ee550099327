"""The main job: the original blog's scenario, end to end, on real daemon processes.

2 clients -> kill -9 one -> restart it -> add a 3rd and a 4th -> (dynamic mode: stall one
with SIGSTOP, then wake it) -> (a resizable broker: double the group's queues under the running
clients) -> scale down to 1 -> stop publishing -> drain -> report.
The validator runs in this process so the timeline of which client serves which queue can be
printed as it changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lbg.admin.resize import resize_group
from lbg.broker import connect_broker
from lbg.devstack.deployment import LocalDeployment
from lbg.liveview import LiveView, serve_live_view
from lbg.model.group import GroupConfig
from lbg.model.sequence import Report
from lbg.settings import BrokerSettings
from lbg.validator import Validator, run_validator, wait_until_complete

DEMO_GROUP = "demo"
CLIENT_COUNT = 4
PROGRESS_SECONDS = 5.0


@dataclass(frozen=True)
class DemoOptions:
    """Knobs of one demo run; `duration` is the publishing time, split over the phases."""

    broker_url: str
    admin_url: str | None = None
    duration: float = 60.0
    rate: float = 500.0
    keys: int = 100
    hash_count: int = 64
    queue_count: int = 4
    cycle_seconds: float = 5.0
    drain_timeout: float = 60.0
    mode: str = "dynamic"
    web_port: int = 0


class Timeline:
    """Prints what happens, stamped with seconds since the start."""

    def __init__(self, echo: Callable[[str], None]) -> None:
        self._echo = echo
        self._start = time.monotonic()

    def say(self, text: str) -> None:
        self._echo(f"[{time.monotonic() - self._start:6.1f}s] {text}")

    def queue_changed(self, queue: int, old: str | None, new: str, _at: float | None) -> None:
        self.say(f"    queue {queue}: {old or '-'} -> {new}")


def client_name(index: int) -> str:
    return f"client-{index}"


async def _phase(timeline: Timeline, validator: Validator, seconds: float) -> None:
    """Let the system run for a phase, printing progress every 5 s at most: equal steps, so
    that a phase's last sliver never turns into a burst of identical lines."""
    steps = max(1, math.ceil(seconds / PROGRESS_SECONDS))
    for _ in range(steps):
        await asyncio.sleep(seconds / steps)
        timeline.say(f"    {validator.progress_line()}")


async def run_demo(options: DemoOptions, workdir: Path, echo: Callable[[str], None]) -> Report:
    """Play the scenario against `options.broker_url` and return the validator's report."""
    timeline = Timeline(echo)
    config = GroupConfig(
        hash_prefix=DEMO_GROUP,
        hash_count=options.hash_count,
        queue_count=options.queue_count,
    )
    settings = BrokerSettings(url=options.broker_url, admin_url=options.admin_url)
    broker = await connect_broker(settings, "lbg-demo")
    local = LocalDeployment(options.broker_url, DEMO_GROUP, workdir)
    view = LiveView(DEMO_GROUP)

    def queue_changed(queue: int, old: str | None, new: str, at: float | None) -> None:
        timeline.queue_changed(queue, old, new, at)
        view.queue_changed(queue, old, new, at)

    validator = Validator(on_queue_change=queue_changed, on_observation=view.observed)
    stop_validator = asyncio.Event()
    validation: asyncio.Task[Report] | None = None
    web = None
    try:
        if options.web_port:
            web = await serve_live_view(view, validator, options.web_port, "127.0.0.1")
            timeline.say(f"live view: http://127.0.0.1:{options.web_port}/")
        if DEMO_GROUP in await broker.list_groups():
            await broker.delete_group(DEMO_GROUP)
        await broker.create_group(DEMO_GROUP, config)
        timeline.say(f"group '{DEMO_GROUP}' created: {config.to_json()}")
        validation = asyncio.create_task(
            run_validator(broker, DEMO_GROUP, validator, stop_validator, progress_interval=0)
        )
        dynamic = options.mode == "dynamic"
        grow = broker.resizable and config.hash_count % (2 * config.queue_count) == 0
        phase = options.duration / ((6 if dynamic else 5) + grow)

        def start_client(index: int) -> None:
            name = client_name(index)
            if dynamic:
                local.start(name, "lbg-client", "--id", name)
            else:
                local.start_client(name, index, CLIENT_COUNT, options.cycle_seconds)

        how = "dynamic membership" if dynamic else f"static mode, client count {CLIENT_COUNT}"
        timeline.say(f"start 2 clients ({how})")
        start_client(0)
        start_client(1)
        await asyncio.sleep(1.0)
        timeline.say(f"start publishing: {options.keys} keys at {options.rate:.0f} events/s")
        publisher = local.start_publisher(
            "publisher", "--keys", str(options.keys), "--rate", str(options.rate)
        )
        await _phase(timeline, validator, phase)

        timeline.say("kill -9 client-1 (crash with messages in flight)")
        local.daemons[client_name(1)].send(signal.SIGKILL)
        await _phase(timeline, validator, phase)

        timeline.say("restart client-1")
        start_client(1)
        await _phase(timeline, validator, phase)

        timeline.say("add client-2 and client-3")
        start_client(2)
        start_client(3)
        await _phase(timeline, validator, phase)

        if dynamic:
            timeline.say("stall client-2 (SIGSTOP: alive but stuck)")
            local.daemons[client_name(2)].send(signal.SIGSTOP)
            await _phase(timeline, validator, phase / 2)
            timeline.say("wake client-2 (SIGCONT): it must fence itself, then rejoin")
            local.daemons[client_name(2)].send(signal.SIGCONT)
            await _phase(timeline, validator, phase / 2)

        if grow:
            done, not_told = await resize_group(broker, DEMO_GROUP, 2 * config.queue_count)
            timeline.say(
                f"resize the group: QC {done.before.queue_count} -> {done.after.queue_count} "
                f"after position {done.switch_position}; the running clients follow"
                + (f" (not told at once: {not_told})" if not_told else "")
            )
            await _phase(timeline, validator, phase)

        timeline.say("scale down to 1 client (SIGTERM client-1, client-2, client-3)")
        for index in (1, 2, 3):
            local.daemons[client_name(index)].send(signal.SIGTERM)
        await _phase(timeline, validator, phase)

        timeline.say("stop publishing")
        publisher.send(signal.SIGTERM)
        if await asyncio.to_thread(publisher.wait, 30.0) != 0:
            timeline.say(f"publisher failed:\n{publisher.log_tail()}")
        timeline.say("drain: waiting until every published event is accounted for")
        drained = await wait_until_complete(validator, options.drain_timeout)
        timeline.say("drained" if drained else "drain timed out")
    finally:
        stop_validator.set()
        if validation is not None:
            with contextlib.suppress(Exception):
                await validation
        await asyncio.to_thread(local.stop_all)
        await broker.close()
        if web is not None:
            await web.cleanup()
    return validator.report()
