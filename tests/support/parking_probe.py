"""What a member does with its group's parked keys, as one probe for the security tests."""

from lbg.broker.base import Broker
from lbg.model.parking import parked


async def park_and_unpark(broker: Broker, group: str) -> str:
    """Everything a member does with its group's parked keys: park, read, replay, unpark."""
    lot = broker.parking(group)
    await lot.put("k", parked("k", "probe", 1, "probe").to_json())
    await lot.append("k", b"{}", {"Lbg-Seq": "1"})
    [event] = await lot.events("k")
    assert "k" in await lot.records()
    await lot.trim("k", event.position)
    await lot.delete("k")
    assert await lot.events("k") == [] and await lot.records() == {}
    return "ok"
