"""Solace ownership epochs without a broker: RGMIDs as the API orders them, claims read back
through a browser, and a binding that holds deliveries back until its claim is in.

The RGMID order is checked against the installed C library's own compare(); the browser and
the flow are fakes at the API's boundary (no Solace broker runs here: make test-solace checks
the real one, tests/integration/test_solace_live.py).
"""

from __future__ import annotations

import asyncio
import queue
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from solace.messaging.errors.pubsubplus_client_error import IllegalArgumentError
from solace.messaging.receiver.inbound_message import ReplicationGroupMessageId
from test_solace_adapter import FakeFlow, read, settle

from lbg.broker.base import BrokerError
from lbg.broker.solace import claims
from lbg.broker.solace.binding import FlowEvents, SolaceQueueBinding
from lbg.broker.solace.browse import QueueMissing
from lbg.broker.solace.claims import OwnerClaims, parse_rgmid

ORIGINS = st.integers(min_value=1, max_value=2**64 - 1)  # the API refuses origin 0
COUNTERS = st.integers(min_value=1, max_value=2**64 - 1)


def rgmid(origin: int, counter: int) -> str:
    """An RGMID's string form: rmid1:<5>-<11>-<8>-<8> hex digits."""
    o, c = f"{origin:016x}", f"{counter:016x}"
    return f"rmid1:{o[:5]}-{o[5:]}-{c[:8]}-{c[8:]}"


def sign(n: int) -> int:
    return (n > 0) - (n < 0)


@given(ORIGINS, COUNTERS, COUNTERS)
def test_epochs_order_as_the_api_orders_rgmids_of_one_origin(origin: int, a: int, b: int) -> None:
    first, second = rgmid(origin, a), rgmid(origin, b)
    api_order = ReplicationGroupMessageId.of(first).compare(ReplicationGroupMessageId.of(second))

    assert parse_rgmid(first) == (f"{origin:016x}", a)
    assert sign(api_order) == sign(parse_rgmid(first)[1] - parse_rgmid(second)[1])


@given(ORIGINS, ORIGINS, COUNTERS)
def test_the_api_refuses_to_order_rgmids_of_two_origins(one: int, other: int, n: int) -> None:
    if one == other:
        return
    with pytest.raises(IllegalArgumentError, match="different origins"):
        ReplicationGroupMessageId.of(rgmid(one, n)).compare(
            ReplicationGroupMessageId.of(rgmid(other, n))
        )
    assert parse_rgmid(rgmid(one, n))[0] != parse_rgmid(rgmid(other, n))[0]


@pytest.mark.parametrize(
    "text", ["", "rmid1:", "rmid2:3477f-a5ce52a2c3d-00000000-000f0e1b", "rmid1:3477fa5ce52a2c3d"]
)
def test_what_is_not_an_rgmid_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a Replication Group Message ID"):
        parse_rgmid(text)


class FakeSpool:
    """A claims queue: published claims get the next counter of one origin; a browser reads
    them, in spool order, from another thread."""

    def __init__(self, origin: int = 0x3477FA5CE52A2C3D, start: int = 1000) -> None:
        self.origin, self.counter = origin, start
        self.kept: queue.Queue[Any] = queue.Queue()
        self.exists = True
        self.persist = True
        self.topics: list[str] = []

    async def publish(self, topic: str, body: bytes, headers: dict[str, str]) -> None:
        self.topics.append(topic)
        self.counter += 7  # other messages of the origin take counters in between
        if self.persist:
            rg = ReplicationGroupMessageId.of(rgmid(self.origin, self.counter))
            self.kept.put(
                SimpleNamespace(
                    get_properties=lambda: dict(headers),
                    get_replication_group_message_id=lambda: rg,
                )
            )

    def open_browser(self, name: str) -> Any:
        if not self.exists:
            raise QueueMissing(f"cannot browse queue '{name}': Unknown Queue")
        return SimpleNamespace(name=name, terminate=lambda grace=0: None)

    def browse(self, browser: Any, name: str) -> list[Any]:
        try:
            return [self.kept.get(timeout=0.05)]
        except queue.Empty:
            return []


def test_claims_read_back_get_ever_higher_epochs() -> None:
    async def scenario() -> list[int]:
        spool = FakeSpool()
        owner = OwnerClaims(spool.open_browser, spool.browse, spool.publish)
        await owner.prepare("g1")
        epochs = [await owner.claim("g1", n % 2, b"{}") for n in range(4)]
        await owner.close()
        assert spool.topics == ["_lbgctl/g1/owners/0", "_lbgctl/g1/owners/1"] * 2
        return epochs

    epochs = asyncio.run(scenario())

    assert epochs == [1007, 1014, 1021, 1028]


def test_a_group_without_a_claims_queue_names_the_upgrade() -> None:
    async def scenario() -> None:
        spool = FakeSpool()
        spool.exists = False
        owner = OwnerClaims(spool.open_browser, spool.browse, spool.publish)
        with pytest.raises(
            BrokerError, match=r"claims queue 'lbg\.g1\.owners'.*`cg-admin upgrade g1`"
        ):
            await owner.prepare("g1")
        with pytest.raises(BrokerError, match="cg-admin upgrade g1"):
            await owner.claim("g1", 0, b"{}")

    asyncio.run(scenario())


def test_a_claim_never_read_back_fails_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(claims, "CLAIM_TIMEOUT", 0.2)

    async def scenario() -> None:
        spool = FakeSpool()
        spool.persist = False
        owner = OwnerClaims(spool.open_browser, spool.browse, spool.publish)
        with pytest.raises(BrokerError, match=r"not read back within 0\.2s"):
            await owner.claim("g1", 0, b"{}")
        await owner.close()

    asyncio.run(scenario())


class Claims:
    """Claims the test answers by hand: each claim waits for its result."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[int]] = []

    async def __call__(self, pin: str) -> int:
        found = asyncio.get_running_loop().create_future()
        self.pending.append(found)
        return await found


async def claiming_binding(claim: Claims) -> tuple[SolaceQueueBinding, list[FakeFlow]]:
    flows: list[FakeFlow] = []

    def open_flow(events: FlowEvents) -> FakeFlow:
        flows.append(FakeFlow(events))
        return flows[-1]

    binding = SolaceQueueBinding(0, open_flow, read, True, "client-a", claim=claim)
    await binding.start()
    return binding, flows


def test_deliveries_wait_for_the_claim_and_carry_its_epoch() -> None:
    async def scenario() -> None:
        claim = Claims()
        binding, flows = await claiming_binding(claim)
        flows[0].send(True, b"m1", b"m2")
        await settle()
        assert binding.active and len(claim.pending) == 1
        assert binding.ready() is None, "a delivery went out before its ownership was claimed"
        claim.pending[0].set_result(1007)
        await settle()
        flows[0].send(b"m3")
        await settle()
        got = [await binding.next() for _ in range(3)]
        assert [(d.body, d.owner_epoch) for d in got] == [
            (b"m1", 1007),
            (b"m2", 1007),
            (b"m3", 1007),
        ]
        flows[0].send(False, True, b"m4")  # passivated, then the queue's owner again: a new claim
        await settle()
        assert len(claim.pending) == 2 and binding.ready() is None
        claim.pending[1].set_result(1042)
        await settle()
        assert (await binding.next()).owner_epoch == 1042
        await binding.close()

    asyncio.run(scenario())


def test_a_failed_claim_gives_the_queue_up() -> None:
    async def scenario() -> None:
        claim = Claims()
        binding, flows = await claiming_binding(claim)
        flows[0].send(True, b"m1")
        await settle()
        claim.pending[0].set_exception(BrokerError("claims queue not browsed"))
        await settle()
        assert not binding.active and flows[0].terminated and flows[0].acked == []
        assert len(flows) == 2 and flows[1].started, "not standing by again"
        assert binding.ready() is None
        await binding.close()

    asyncio.run(scenario())


def test_a_claim_that_comes_back_after_the_queue_was_lost_is_ignored() -> None:
    async def scenario() -> None:
        claim = Claims()
        binding, flows = await claiming_binding(claim)
        flows[0].send(True, b"m1")
        await settle()
        flows[0].send(False)
        await settle()
        claim.pending[0].set_result(1007)
        await settle()
        assert not binding.active and binding.ready() is None
        await binding.close()

    asyncio.run(scenario())
