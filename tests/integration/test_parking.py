"""Ordered dead letters on real brokers, real daemons: a handler fails for good (or hangs) on
one key's 5th event; that key is parked with its later events while the others are handled;
`lbg parked` lists it; after the fix `lbg unpark` replays it, and every key's events were
handled exactly once, in order (also across a kill -9 of the member while the key is parked,
and with --skip-first)."""

import asyncio
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from tests.integration.test_any_producer import ROOT
from tests.integration.test_operator_commands import lbg
from tests.support.recorder import read_records

from lbg.broker import connect_broker
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment
from lbg.model.destinations import event_destination
from lbg.model.group import GroupConfig
from lbg.settings import BrokerSettings

HANDLER = "tests.support.poison:handle"
KEYS = [f"order-{i}" for i in range(12)]
POISON = KEYS[3]
PARKING_BROKERS = ("nats", "rabbitmq", "messagedb")


@pytest.fixture
def poisoned(broker: BrokerEndpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The poison file (absent: the handler is fixed) and the recording folder."""
    if broker.kind not in PARKING_BROKERS:
        pytest.skip(f"parking is not built on {broker.kind} yet")
    folder = tmp_path / "records"
    folder.mkdir()
    monkeypatch.setenv("LBG_TEST_RECORD_DIR", str(folder))
    monkeypatch.setenv("LBG_TEST_POISON", str(tmp_path / "poison"))
    # This checkout's package and its tests.support first, whatever the venv installed.
    paths = [str(ROOT / "services"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(paths))
    return tmp_path / "poison"


def publish(deployment: LocalDeployment, seqs: range) -> None:
    """Publish events `seqs` of every key, numbered by Lbg-Seq, key after key per seq."""

    async def main() -> None:
        broker = await connect_broker(BrokerSettings(url=deployment.broker_url), "test-pub")
        try:
            config: GroupConfig = await broker.read_group(deployment.group)
            for seq in seqs:
                for key in KEYS:
                    where = event_destination(config.hash_prefix, config.bucket_for_key(key), key)
                    await broker.publish(where, orjson.dumps({"seq": seq}), {"Lbg-Seq": str(seq)})
        finally:
            await broker.close()

    asyncio.run(main())


def handled(folder: Path) -> dict[str, list[int]]:
    """Per key, the seqs the handler recorded, in the order it handled them."""
    seqs: dict[str, list[int]] = {}
    for item in read_records(folder):
        seqs.setdefault(item["key"], []).append(int(item["headers"]["Lbg-Seq"]))
    return seqs


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 40.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def parked(deployment: LocalDeployment) -> list[dict]:
    result = lbg(deployment, "parked", "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


def others_done(folder: Path, last: int) -> bool:
    seqs = handled(folder)
    return all(seqs.get(k, [])[-1:] == [last] for k in KEYS if k != POISON)


# The plain replay runs by default; the kill -9 and --skip-first variants (about 25 s each on
# NATS, a minute on RabbitMQ) in make test-slow.
@pytest.mark.parametrize(
    "variant",
    [
        "replay",
        pytest.param("kill-9", marks=pytest.mark.slow),
        pytest.param("skip-first", marks=pytest.mark.slow),
    ],
)
def test_a_poison_key_is_parked_and_replayed_in_order(
    variant: str, make_group, deployment: LocalDeployment, poisoned: Path, tmp_path: Path
) -> None:
    make_group()
    folder = tmp_path / "records"
    poisoned.write_text(f"{POISON} 5 fail")
    members = {
        n: deployment.start(
            n,
            "lbg-client",
            "--id",
            n,
            "--handler",
            HANDLER,
            "--retries",
            "2",
        )
        for n in ("client-a", "client-b")
    }
    publish(deployment, range(1, 11))
    wait_for(lambda: others_done(folder, 10), "the other keys")
    wait_for(lambda: parked(deployment) and parked(deployment)[0]["events"] == 6, "the lot")
    [listed] = parked(deployment)
    assert (listed["key"], listed["state"]) == (POISON, "parked")
    assert f"cannot apply {POISON} #5" in listed["reason"]
    assert handled(folder)[POISON] == [1, 2, 3, 4], "its later events were not handled"
    text = lbg(deployment, "parked")
    assert text.returncode == 0 and text.stdout.startswith(f"{POISON}\tparked\t6 events")

    last = 10
    if variant == "kill-9":
        owner = next(r["client"] for r in read_records(folder) if r["key"] == POISON)
        members[owner].send(signal.SIGKILL)
        publish(deployment, range(11, 13))  # served by the survivor: parked behind the others
        last = 12
        wait_for(lambda: others_done(folder, last), "the other keys after the kill")
        wait_for(lambda: parked(deployment)[0]["events"] == 8, "the survivor parking the key")
        assert handled(folder)[POISON] == [1, 2, 3, 4]
    poisoned.unlink()
    flags = ["--skip-first"] if variant == "skip-first" else []
    unparked = lbg(deployment, "unpark", POISON, "--timeout", "20", *flags)
    assert unparked.returncode == 0, unparked.stderr
    assert "replayed and unparked" in unparked.stdout
    assert parked(deployment) == []
    publish(deployment, range(last + 1, last + 2))
    wait_for(
        lambda: others_done(folder, last + 1) and handled(folder)[POISON][-1] == last + 1,
        "the new events after the replay",
    )
    skipped = [5] if variant == "skip-first" else []
    for key, seqs in handled(folder).items():
        expected = [s for s in range(1, last + 2) if key != POISON or s not in skipped]
        assert seqs == expected, f"{key}: handled {seqs}"


def test_a_handler_hanging_on_one_event_parks_its_key_not_the_group(
    make_group, deployment: LocalDeployment, poisoned: Path, tmp_path: Path
) -> None:
    make_group()
    folder = tmp_path / "records"
    poisoned.write_text(f"{POISON} 5 hang")
    for name in ("client-a", "client-b", "client-c"):
        deployment.start(
            name, "lbg-client", "--id", name, "--handler", HANDLER, "--stall-timeout", "2"
        )
    publish(deployment, range(1, 11))
    wait_for(lambda: others_done(folder, 10), "the other keys", timeout=60)
    wait_for(lambda: parked(deployment) and parked(deployment)[0]["state"] == "parked", "parking")
    [listed] = parked(deployment)
    assert listed["stalls"] == 2 and "hung" in listed["reason"]
    wait_for(lambda: parked(deployment)[0]["events"] == 6, "the lot")
    publish(deployment, range(11, 12))
    wait_for(lambda: others_done(folder, 11), "the group going on")
    assert handled(folder)[POISON] == [1, 2, 3, 4]
