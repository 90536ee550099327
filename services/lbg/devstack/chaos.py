"""The chaos soak's pure decisions: which fault to inject next, why a duplicate happened, and
which of the lease's alarms no fault explains.

The soak runner (lbg.devstack.soak) applies the actions to real processes; keeping the choices here
makes them testable without a broker: the pool never drops below its minimum of live
clients, a stopped client is always woken again, and every duplicate gets a cause.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lbg.devstack.alarms import LeaseAlarm


class Fault(enum.Enum):
    """What the soak does to one client (or to the broker)."""

    KILL = "kill -9"
    STOP = "SIGSTOP"
    RESTART = "SIGTERM and restart"
    START = "start a new client"
    BROKER_RESTART = "broker restart"


@dataclass(frozen=True)
class Action:
    """One fault aimed at one client (None for the broker)."""

    fault: Fault
    client: str | None


@dataclass(frozen=True)
class ChaosPolicy:
    """Bounds of the soak: live clients stay within [min_clients, max_clients]."""

    min_clients: int = 2
    max_clients: int = 5

    def __post_init__(self) -> None:
        if not 1 <= self.min_clients <= self.max_clients:
            raise ValueError(
                f"need 1 <= min_clients <= max_clients, got {self.min_clients}, {self.max_clients}"
            )


def choose_action(
    rng: random.Random, live: Sequence[str], policy: ChaosPolicy, new_name: str
) -> Action:
    """The next fault for the pool of `live` (running, not stopped) clients.

    Kill and stop only while more than `min_clients` are live, so the group keeps consumers;
    start a new client (`new_name`) when below `max_clients` and nothing else may be done.
    """
    choices: list[Action] = []
    if len(live) > policy.min_clients:
        victim = rng.choice(list(live))
        choices += [Action(Fault.KILL, victim), Action(Fault.STOP, victim)]
    if live:
        choices.append(Action(Fault.RESTART, rng.choice(list(live))))
    if len(live) < policy.max_clients:
        choices.append(Action(Fault.START, new_name))
    return rng.choice(choices)


@dataclass(frozen=True)
class FaultRecord:
    """A fault as it was applied: to whom and when (monotonic seconds)."""

    fault: Fault
    client: str | None
    at: float


UNEXPLAINED = "no fault nearby"
# A lease alarm may follow its fault by this much: a woken member fences itself at its next
# round, a restarted one is away while its process exits and starts again.
ALARM_GRACE = 5.0
# Any member may lose its lease while the broker restarts (a RabbitMQ node takes ~10 s).
BROKER_RESTART_GRACE = 30.0
# Log lines carry milliseconds of the wall clock; the faults the monotonic clock.
CLOCK_SLACK = 0.01


def duplicate_cause(
    previous_client: str | None,
    client: str,
    at: float,
    faults: Sequence[FaultRecord],
    window: float,
) -> str:
    """Name the fault that explains a duplicate delivery seen at `at` by `client`.

    A redelivery follows the loss of the client that had the key before (`previous_client`)
    or a broker restart, within `window` seconds; the most recent such fault is the cause.
    """
    suspects = {previous_client, client}
    for record in reversed(faults):
        if record.at > at:
            continue
        if at - record.at > window:
            break
        if record.fault is Fault.BROKER_RESTART or record.client in suspects:
            return record.fault.value
    return UNEXPLAINED


def tally(causes: Sequence[str]) -> Mapping[str, int]:
    """Count duplicates per cause, most frequent first."""
    return dict(Counter(causes).most_common())


def explains(record: FaultRecord, alarm: LeaseAlarm, stop_seconds: float, grace: float) -> bool:
    """Whether the fault accounts for the alarm (both on the monotonic clock): a killed member
    is gone for good; a stopped one is evicted while stopped and fences itself on waking; a
    restarted one may be taken for gone while it restarts; a broker restart may cost anyone
    their lease while the broker is down."""
    if not record.at <= alarm.at + CLOCK_SLACK:
        return False
    if record.fault is Fault.BROKER_RESTART:
        return alarm.at <= record.at + BROKER_RESTART_GRACE
    if record.client != alarm.member:
        return False
    if record.fault is Fault.KILL:
        return True
    if record.fault is Fault.STOP:
        return alarm.at <= record.at + stop_seconds + grace
    return record.fault is Fault.RESTART and alarm.at <= record.at + grace


def false_alarms(
    alarms: Iterable[LeaseAlarm],
    faults: Sequence[FaultRecord],
    stop_seconds: float,
    grace: float = ALARM_GRACE,
) -> list[LeaseAlarm]:
    """The alarms no fault explains: live, running members the lease took for dead."""
    return [
        alarm
        for alarm in alarms
        if not any(explains(record, alarm, stop_seconds, grace) for record in faults)
    ]
