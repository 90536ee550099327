"""What a broker can tell of a member's connection, for crash detection faster than a lease.

A broker that knows when a connection closed (NATS) lets a peer ask about a silent member
instead of waiting out the lease's margins (client/presence.py); the others say nothing and
the lease decides alone. Part of the Broker interface (broker/base.py).
"""

from __future__ import annotations

from collections.abc import Callable


class MemberPresence:
    """Presence probes: by default there are none."""

    async def announce_presence(self, group: str, member: str) -> bool:
        """Let the group's other members ask whether this member's connection is still open
        (`probe_member`), for as long as it is. True once the broker answered such a probe
        for it (its heartbeats then say so); False where there is no such probe."""
        return False

    def on_connection_lost(self, listener: Callable[[], None]) -> None:
        """Call `listener` whenever the connection to the broker drops (before any reconnect):
        a member probed as gone must stop at once (model/lease.py, OwnLease.lapse)."""
        return None

    async def probe_member(self, group: str, member: str) -> bool | None:
        """Whether the broker says `member`'s connection closed: True (gone: it can take and
        ack nothing more), False (it answered), None (no answer in time, or no such probe).

        True only where every control message the member sent before its connection closed
        reached this member's control handler before the answer: a peer then knows the last
        heartbeat the member sent, and so when the member stopped (model/lease.py)."""
        return None
