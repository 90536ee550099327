"""Whether a member's connection is still open, asked of the server: a crash seen at once.

Each member answers requests on `_lbgctl.<g>.alive.<member>`. The server drops a connection's
subscriptions when it closes (a kill -9 closes the socket), and then answers a request there
itself with "no responders". That answer comes back on the asker's connection after every
heartbeat the member sent before closing (the server forwards in order, and the control
handler runs in the read loop: direct.py), so the asker knows the member's last heartbeat,
and with it when the member stopped processing. A member that is alive but silent (stopped,
cut off: the server still holds its subscription) gives no answer, and its peers wait out
its lease as before.
"""

from __future__ import annotations

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from lbg.broker.base import BrokerError, why
from lbg.broker.nats.connection import SUBJECT_TOKEN
from lbg.broker.nats.direct import is_direct

# How long a probe waits for a live member's answer: past it, the member is taken as silent.
PROBE_TIMEOUT = 0.5


def presence_subject(control_prefix: str, group: str, member: str) -> str:
    """The subject a member answers presence probes on (under the group's control subjects,
    which its client user may already publish and subscribe to)."""
    return f"{control_prefix}.{group}.alive.{member}"


def probeable(member: str) -> bool:
    """A member id that can stand in a subject token (any other is never probed)."""
    return SUBJECT_TOKEN.fullmatch(member) is not None


async def answer_probes(nc: Client, subject: str) -> None:
    """Answer every probe on `subject` (an empty reply) for as long as the connection is open."""

    async def answer(msg: Msg) -> None:
        if msg.reply:
            await msg.respond(b"")

    await nc.subscribe(subject, cb=answer)


async def probe(nc: Client, subject: str) -> bool | None:
    """True when the server says nobody answers on `subject`, False when someone answered,
    None when no answer came in time or the request failed."""
    try:
        await nc.request(subject, b"", timeout=PROBE_TIMEOUT)
    except NoRespondersError:
        return True
    except (NatsTimeoutError, TimeoutError, NatsError):
        return None
    return False


class NatsPresence:
    """One connection's presence: answering for its members, asking about others."""

    def __init__(self, nc: Client, control_prefix: str) -> None:
        self._nc = nc
        self._prefix = control_prefix
        # Groups whose control messages reach their handler from the read loop, in order:
        # only there does a probe's "gone" come after the member's last heartbeat.
        self._heard_in_order: set[str] = set()

    def control_subscribed(self, group: str, subscription: Subscription) -> None:
        """The group's control messages now come through `subscription`."""
        if is_direct(subscription):
            self._heard_in_order.add(group)

    async def announce(self, group: str, member: str) -> bool:
        """Answer for `member`; True once an answer came back (only that proves the server
        took the subscription: an older group's client user may not subscribe there)."""
        if not probeable(member):
            return False
        subject = presence_subject(self._prefix, group, member)
        try:
            await answer_probes(self._nc, subject)
        except NatsError as exc:
            raise BrokerError(f"presence not announced: {why(exc)}") from None
        return await probe(self._nc, subject) is False

    async def ask(self, group: str, member: str) -> bool | None:
        """Whether `member`'s connection closed (Broker.probe_member)."""
        if group not in self._heard_in_order or not probeable(member):
            return None
        return await probe(self._nc, presence_subject(self._prefix, group, member))
