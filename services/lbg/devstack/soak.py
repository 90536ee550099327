"""The chaos soak: steady load while clients are killed, stalled and restarted and the broker
restarts, with the validator counting every event.

Clients run in dynamic membership as real processes (so kill -9 and SIGSTOP are real); the
validator runs in this process, so every duplicate is attributed to the fault that caused it
as it is seen. The verdict is the validator's: 0 lost and 0 reordered, whatever happened.
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from lbg.broker import connect_broker
from lbg.devstack.alarms import EVICTED, SELF_FENCED, LeaseAlarm, lease_alarms
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.chaos import (
    Action,
    ChaosPolicy,
    Fault,
    FaultRecord,
    choose_action,
    duplicate_cause,
    false_alarms,
    tally,
)
from lbg.devstack.demo import Timeline
from lbg.devstack.deployment import LocalDeployment
from lbg.model.group import GroupConfig
from lbg.model.sequence import Observation, Outcome, Report
from lbg.settings import BrokerSettings
from lbg.validator import Validator, run_validator, wait_until_complete

SOAK_GROUP = "soak"
CAUSE_WINDOW = 60.0
PROGRESS_SECONDS = 10.0


@dataclass(frozen=True)
class SoakOptions:
    """Knobs of one soak run; faults come every `fault_interval` seconds (jittered)."""

    endpoint: BrokerEndpoint
    duration: float = 600.0
    rate: float = 300.0
    keys: int = 200
    hash_count: int = 64
    queue_count: int = 8
    fault_interval: float = 3.0
    stop_seconds: float = 3.0
    policy: ChaosPolicy = field(default_factory=ChaosPolicy)
    broker_restart: bool = True
    seed: int = 0
    drain_stall: float = 60.0
    # Given to every client, e.g. ("--config", "fast-failover.toml").
    client_args: tuple[str, ...] = ()


@dataclass
class SoakResult:
    """The validator's report plus what the soak did and why duplicates happened."""

    report: Report
    faults: dict[str, int]
    duplicate_causes: dict[str, int]
    tracebacks: dict[str, int]
    drained: bool
    validator_error: str | None = None
    # Live members the lease took for dead (no fault of the soak explains them): a lease too
    # short for the machine's load; they cost handovers and duplicates, not the verdict.
    false_alarms: dict[str, int] = field(default_factory=lambda: {EVICTED: 0, SELF_FENCED: 0})

    @property
    def ok(self) -> bool:
        """Nothing lost or reordered, every event accounted for, and nothing crashed."""
        return self.report.ok and self.drained and not self.tracebacks and not self.validator_error

    def to_dict(self) -> dict[str, object]:
        return asdict(self) | {"report": self.report.to_dict(), "ok": self.ok}

    def to_text(self) -> str:
        lines = [self.report.to_text(), "faults injected:"]
        lines += [f"  {fault:<22}{count}" for fault, count in self.faults.items()]
        lines.append("duplicates by cause:")
        lines += [f"  {cause:<22}{count}" for cause, count in self.duplicate_causes.items()]
        if not self.duplicate_causes:
            lines.append("  (none)")
        lines.append(
            "live members evicted / self-fenced (no fault explains them): "
            f"{self.false_alarms[EVICTED]} / {self.false_alarms[SELF_FENCED]}"
        )
        for name, count in self.tracebacks.items():
            lines.append(f"traceback in {name}.log: {count}")
        if self.validator_error:
            lines.append(f"validator failed: {self.validator_error}")
        lines.append(f"{'soak':<14}{'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


class _Pool:
    """The soak's client processes: which are live, which are stopped, and their names."""

    def __init__(self, local: LocalDeployment, client_args: tuple[str, ...]) -> None:
        self.local = local
        self.client_args = client_args
        self.live: list[str] = []
        self.stopped: set[str] = set()
        self._started = 0

    def new_name(self) -> str:
        return f"client-{self._started}"

    def start(self, name: str) -> None:
        self.local.start(name, "lbg-client", "--id", name, *self.client_args)
        self.live.append(name)
        self._started = max(self._started, int(name.rsplit("-", 1)[1]) + 1)

    def signal(self, name: str, signum: int) -> None:
        self.local.daemons[name].send(signum)


async def run_soak(options: SoakOptions, workdir: Path, echo: Callable[[str], None]) -> SoakResult:
    """Run the soak against `options.endpoint` and return the verdict."""
    timeline = Timeline(echo)
    rng = random.Random(options.seed)
    faults: list[FaultRecord] = []
    causes: list[str] = []

    def observed(observation: Observation) -> None:
        if observation.outcome is Outcome.DUPLICATE:
            causes.append(
                duplicate_cause(
                    observation.previous_client,
                    observation.client,
                    time.monotonic(),
                    faults,
                    CAUSE_WINDOW,
                )
            )

    endpoint = options.endpoint
    broker = await connect_broker(
        BrokerSettings(url=endpoint.url, admin_url=endpoint.admin_url), "lbg-soak"
    )
    local = LocalDeployment(endpoint.url, SOAK_GROUP, workdir)
    pool = _Pool(local, options.client_args)
    validator = Validator(on_observation=observed)
    stop_validator = asyncio.Event()
    validation: asyncio.Task[Report] | None = None
    wakers: set[asyncio.Task[None]] = set()
    drained = False
    validator_error: str | None = None
    try:
        if SOAK_GROUP in await broker.list_groups():
            await broker.delete_group(SOAK_GROUP)
        config = GroupConfig(
            hash_prefix=SOAK_GROUP, hash_count=options.hash_count, queue_count=options.queue_count
        )
        await broker.create_group(SOAK_GROUP, config)
        validation = asyncio.create_task(
            run_validator(broker, SOAK_GROUP, validator, stop_validator, progress_interval=0)
        )
        for _ in range(options.policy.min_clients + 1):
            pool.start(pool.new_name())
        await asyncio.sleep(1.0)
        publisher = local.start_publisher(
            "publisher", "--keys", str(options.keys), "--rate", str(options.rate)
        )
        timeline.say(
            f"soak for {options.duration:g}s: {options.rate:g} events/s over {options.keys} keys,"
            f" a fault every ~{options.fault_interval:g}s, {len(pool.live)} clients"
        )

        def record(action: Action) -> None:
            faults.append(FaultRecord(action.fault, action.client, time.monotonic()))
            timeline.say(f"{action.fault.value}: {action.client or 'broker'}")

        async def wake(name: str) -> None:
            await asyncio.sleep(options.stop_seconds)
            pool.signal(name, signal.SIGCONT)
            pool.stopped.discard(name)
            pool.live.append(name)

        async def apply(action: Action) -> None:
            record(action)
            name = action.client
            assert name is not None
            if action.fault is Fault.START:
                pool.start(name)
                return
            pool.live.remove(name)
            if action.fault is Fault.KILL:
                pool.signal(name, signal.SIGKILL)
            elif action.fault is Fault.STOP:
                pool.signal(name, signal.SIGSTOP)
                pool.stopped.add(name)
                waker = asyncio.create_task(wake(name))
                wakers.add(waker)
                waker.add_done_callback(wakers.discard)
            elif action.fault is Fault.RESTART:
                pool.signal(name, signal.SIGTERM)
                await asyncio.to_thread(local.daemons[name].wait, 30.0)
                pool.start(name)

        started = time.monotonic()
        restart_at = started + options.duration / 2 if options.broker_restart else None
        next_progress = started + PROGRESS_SECONDS
        while (now := time.monotonic()) < started + options.duration:
            await asyncio.sleep(options.fault_interval * rng.uniform(0.5, 1.5))
            if restart_at is not None and time.monotonic() >= restart_at and endpoint.restart:
                restart_at = None
                record(Action(Fault.BROKER_RESTART, None))
                await asyncio.to_thread(endpoint.restart)
                timeline.say("broker back")
            else:
                await apply(choose_action(rng, pool.live, options.policy, pool.new_name()))
            if now >= next_progress:
                timeline.say(f"    {validator.progress_line()}")
                next_progress = now + PROGRESS_SECONDS

        timeline.say("stop publishing; wake every stopped client")
        for waker in list(wakers):
            waker.cancel()
        for name in list(pool.stopped):
            pool.signal(name, signal.SIGCONT)
        publisher.send(signal.SIGTERM)
        if await asyncio.to_thread(publisher.wait, 60.0) != 0:
            timeline.say(f"publisher failed:\n{publisher.log_tail()}")
        timeline.say("drain: waiting until every published event is accounted for")
        drained = await _drain(validator, validation, options.drain_stall, timeline)
        timeline.say("drained" if drained else "drain timed out")
    finally:
        for waker in list(wakers):
            waker.cancel()
        stop_validator.set()
        if validation is not None:
            try:
                await validation
            except Exception as exc:
                validator_error = f"{type(exc).__name__}: {exc}"
                timeline.say(f"validator failed: {validator_error}")
        await asyncio.to_thread(local.stop_all)
        await broker.close()
    fault_counts = tally([record.fault.value for record in faults])
    unexplained = false_alarms(_alarms(local), faults, options.stop_seconds)
    for alarm in unexplained:
        timeline.say(f"false alarm: {alarm.member} {alarm.kind} while it ran")
    return SoakResult(
        report=validator.report(),
        faults=dict(fault_counts),
        duplicate_causes=dict(tally(causes)),
        tracebacks=_tracebacks(local),
        drained=drained,
        validator_error=validator_error,
        false_alarms={
            kind: sum(a.kind == kind for a in unexplained) for kind in (EVICTED, SELF_FENCED)
        },
    )


async def _drain(
    validator: Validator, validation: asyncio.Task[Report], stall: float, timeline: Timeline
) -> bool:
    """Wait until every published event is accounted for, saying how far it got meanwhile;
    give up once nothing new arrived for `stall` seconds, or the validator itself stopped."""
    while time.monotonic() - validator.last_message < stall and not validation.done():
        if await wait_until_complete(validator, PROGRESS_SECONDS):
            return True
        timeline.say(f"    {validator.progress_line()}")
    return validator.complete


def _alarms(local: LocalDeployment) -> list[LeaseAlarm]:
    """Every eviction and self-fence the clients logged, on the monotonic clock of the faults."""
    offset = time.time() - time.monotonic()
    return [
        replace(alarm, at=alarm.at - offset)
        for name, daemon in local.daemons.items()
        if name.startswith("client-")
        for alarm in lease_alarms(daemon.log_path)
    ]


def _tracebacks(local: LocalDeployment) -> dict[str, int]:
    """Daemons whose logs show a Python traceback: a crash the soak did not cause on purpose."""
    found: dict[str, int] = {}
    for name, daemon in local.daemons.items():
        if daemon.log_path.exists():
            count = daemon.log_path.read_text(errors="replace").count("Traceback (most recent")
            if count:
                found[name] = count
    return found
