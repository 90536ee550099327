"""A dynamic member's heartbeat timing: how often it beats, its lease and the lease's margin,
and the rules that keep the three safe together (model/lease.py says why). Each broker
adapter has defaults of its own (broker/adapters.py); a config overrides any of them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class HeartbeatTiming:
    """[client] heartbeat_interval, lease and lease_margin, in seconds."""

    interval: float
    lease: float
    margin: float

    def check(self) -> None:
        """The lease leaves a live member two heartbeats before it fences, and the margin lets
        a member's own heartbeat come back within 2 x margin, fencing before the lease ends
        (LeaseTerms): a ValueError naming the key."""
        if self.lease < 3 * self.interval:
            raise ValueError(
                f"lease: must be >= 3 x heartbeat_interval ({3 * self.interval:g}),"
                f" got {self.lease:g}"
            )
        if not self.interval < 2 * self.margin:
            raise ValueError(
                f"lease_margin: must be > heartbeat_interval / 2 ({self.interval / 2:g}),"
                f" got {self.margin:g}"
            )
        if not 2 * self.margin < self.lease:
            raise ValueError(
                f"lease_margin: must be < lease / 2 ({self.lease / 2:g}), got {self.margin:g}"
            )
        if self.lease - self.margin < 2 * self.interval:
            raise ValueError(
                f"lease_margin: lease - lease_margin must be >= 2 x heartbeat_interval"
                f" ({2 * self.interval:g}), got {self.lease - self.margin:g}"
            )

    def given(
        self, interval: float | None, lease: float | None, margin: float | None
    ) -> HeartbeatTiming:
        """These defaults with each value a config gave in its place, checked together."""
        timing = HeartbeatTiming(
            self.interval if interval is None else interval,
            self.lease if lease is None else lease,
            self.margin if margin is None else margin,
        )
        timing.check()
        return timing


# A member on NATS or Message DB: a crash is seen within lease + margin (0.85 s), or once its
# connection is seen closed, lease - margin after its last heartbeat (0.55 s).
DEFAULT_TIMING = HeartbeatTiming(interval=0.15, lease=0.7, margin=0.15)
