"""The NATS fencing token: each claim of a queue's owner record gets a higher epoch."""

import asyncio
import uuid

from lbg.broker.nats.adapter import NatsBroker, claim_epoch
from lbg.settings import BrokerSettings


def test_claims_get_ever_higher_epochs_even_when_they_race(nats_url: str) -> None:
    async def claims() -> tuple[list[int], list[int]]:
        broker = await NatsBroker.connect(BrokerSettings(url=nats_url), "epoch-test")
        try:
            owners = await broker._js.create_key_value(bucket=f"t{uuid.uuid4().hex[:8]}")
            one_by_one = [await claim_epoch(owners, "g.0", f"{n}".encode()) for n in range(3)]
            await owners.purge("g.0")  # a deleted group's record: the next one goes on higher
            racing = await asyncio.gather(
                *(claim_epoch(owners, "g.0", f"racer {n}".encode()) for n in range(4))
            )
            await broker._js.delete_key_value(owners._name)
            return one_by_one, list(racing)
        finally:
            await broker.close()

    one_by_one, racing = asyncio.run(claims())

    assert one_by_one == sorted(set(one_by_one)) and one_by_one[0] > 0
    assert len(set(racing)) == 4, "two racing owners got the same epoch"
    assert min(racing) > max(one_by_one)
