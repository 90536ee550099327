"""The autoscaler's rule as pure functions: how many clients a group's consumer lag asks for,
and when a change may happen (hysteresis, cool-down, calm before a scale-down).

Lag is two numbers per group: the backlog (events waiting or delivered but not acked yet, on
all queues) and the age of the oldest of them. Scale up fast (to what the backlog needs, at
once), scale down slowly (one client at a time, only after the lag has stayed low for
`calm` seconds), and never change twice within `cooldown`: a peak is met within one poll,
and a backlog hovering near a threshold cannot make the count flap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class AutoscalePolicy:
    """When to add or remove clients. Backlogs are events per running client; ages seconds.

    Add while the backlog per client is above `high` or the oldest event is older than
    `high_age`; remove while it is below `low` and the oldest is younger than `low_age`.
    """

    minimum: int = 1
    maximum: int = 4
    high: float = 200.0
    low: float = 20.0
    high_age: float = 5.0
    low_age: float = 1.0
    cooldown: float = 10.0
    calm: float = 10.0

    def problem(self) -> str | None:
        """What makes the policy unusable (thresholds without a gap flap), or None."""
        if self.minimum > self.maximum:
            return f"the minimum ({self.minimum}) is above the maximum ({self.maximum})"
        if self.low >= self.high:
            return f"the low backlog ({self.low:g}) must be below the high one ({self.high:g})"
        if self.low_age >= self.high_age:
            return (
                f"the low age ({self.low_age:g} s) must be below the high one ({self.high_age:g} s)"
            )
        return None


@dataclass(frozen=True)
class Lag:
    """What a group's consumers have not processed yet."""

    backlog: int = 0
    oldest_age: float = 0.0


@dataclass(frozen=True)
class QueueLag:
    """One queue's backlog (waiting plus unacked) and the age of its oldest event, if known."""

    backlog: int
    oldest_age: float | None


def group_lag(
    queues: Mapping[int, QueueLag], backlog_since: Mapping[int, float], now: float
) -> tuple[Lag, dict[int, float]]:
    """The group's lag, and since when each queue has had a backlog. Where the broker cannot
    tell a queue's oldest age, the time since its backlog was last empty stands in (an upper
    bound: nothing waiting now was published before that)."""
    since = {q: backlog_since.get(q, now) for q, lag in queues.items() if lag.backlog > 0}
    ages = [
        lag.oldest_age if lag.oldest_age is not None else now - since[q]
        for q, lag in queues.items()
        if lag.backlog > 0
    ]
    backlog = sum(lag.backlog for lag in queues.values())
    return Lag(backlog, max(ages, default=0.0)), since


def bounded(policy: AutoscalePolicy, clients: int) -> int:
    """`clients` within [minimum, maximum]."""
    return min(max(clients, policy.minimum), policy.maximum)


def wanted(policy: AutoscalePolicy, clients: int, lag: Lag) -> tuple[int, str]:
    """What the lag asks for, ignoring time (an external scaler's one-shot answer): enough
    clients for the backlog at `high` each (at least one more while the oldest is too old),
    one fewer while both are low, else the same; with the reason."""
    per_client = lag.backlog / max(clients, 1)
    described = f"backlog {lag.backlog} ({per_client:.0f}/client), oldest {lag.oldest_age:.1f} s"
    if per_client > policy.high or lag.oldest_age > policy.high_age:
        needed = max(clients + 1, math.ceil(lag.backlog / policy.high))
        return bounded(policy, needed), f"{described}: above high"
    if per_client < policy.low and lag.oldest_age < policy.low_age:
        return bounded(policy, clients - 1), f"{described}: below low"
    return bounded(policy, clients), f"{described}: between low and high"


@dataclass(frozen=True)
class ScalerState:
    """What the rule remembers between polls: the last change and since when it is calm."""

    last_change: float = -math.inf
    calm_since: float | None = None


@dataclass(frozen=True)
class Decision:
    """The count to run now, what the lag asked for, and why the two differ if they do."""

    clients: int
    wanted: int
    reason: str
    held: str | None = field(default=None)


def step(
    policy: AutoscalePolicy, state: ScalerState, clients: int, lag: Lag, now: float
) -> tuple[ScalerState, Decision]:
    """One poll: the bounds apply at once; a scale-up waits only for the cool-down; a
    scale-down also waits until the lag has been low for `calm` seconds, and goes one step."""
    target, reason = wanted(policy, clients, lag)
    calm_since = (
        (state.calm_since if state.calm_since is not None else now) if target < clients else None
    )
    if not policy.minimum <= clients <= policy.maximum:
        held = None
    elif target != clients and now - state.last_change < policy.cooldown:
        held = f"cool-down: {policy.cooldown - (now - state.last_change):.1f} s left"
    elif calm_since is not None and now - calm_since < policy.calm:
        held = f"calm: {now - calm_since:.1f} of {policy.calm:g} s so far"
    else:
        held = None
    if held is not None:
        return ScalerState(state.last_change, calm_since), Decision(clients, target, reason, held)
    if target == clients:
        return ScalerState(state.last_change, calm_since), Decision(clients, target, reason)
    return ScalerState(now, None), Decision(target, target, reason)


def active_clients(owners: Iterable[str | None]) -> int:
    """How many distinct clients hold the queues (the running count seen from the broker)."""
    return len({owner for owner in owners if owner is not None})
