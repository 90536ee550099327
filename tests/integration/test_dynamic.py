"""Dynamic membership on every real broker: join, leave, crash and stall under load."""

import signal
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import Daemon, LocalDeployment

# cg-admin's default priority timeout: NATS moves a silent owner's queue after it.
BROKER_TIMEOUT = 2.0


def member(deployment: LocalDeployment, name: str, *args: str) -> Daemon:
    """Start an lbg-client with no index or count: it joins the group by itself."""
    return deployment.start(name, "lbg-client", "--id", name, *args)


def log_of(deployment: LocalDeployment, name: str) -> str:
    return deployment.daemons[name].log_path.read_text()


def wait_for(predicate, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


def times_of(log: str, text: str) -> list[float]:
    """Epoch times of the log lines that contain `text` (the daemons' asctime format)."""
    return [
        datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in log.splitlines()
        if text in line
    ]


def serving(deployment: LocalDeployment, name: str) -> bool:
    return "now serves queue" in log_of(deployment, name)


def load(deployment: LocalDeployment, seconds: float = 7.0) -> Daemon:
    return deployment.start_publisher(
        "pub", "--keys", "60", "--rate", "800", "--duration", str(seconds)
    )


def test_a_joining_member_takes_its_share_with_no_duplicate(
    make_group, deployment: LocalDeployment, validate
) -> None:
    make_group()
    member(deployment, "client-a")
    member(deployment, "client-b")
    publisher = load(deployment)
    wait_for(lambda: serving(deployment, "client-a"), 15, "nobody became active")
    time.sleep(1.5)
    member(deployment, "client-c")
    wait_for(lambda: serving(deployment, "client-c"), 10, "the new member got no queue")
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0, "a planned move duplicated events"
    assert set(report["per_client"]) == {"client-a", "client-b", "client-c"}


def test_sigterm_hands_every_queue_over_with_no_duplicate(
    make_group, deployment: LocalDeployment, validate
) -> None:
    make_group()
    leaving = member(deployment, "client-a")
    member(deployment, "client-b")
    publisher = load(deployment)
    wait_for(lambda: serving(deployment, "client-a"), 15, "client-a never became active")
    time.sleep(2.0)
    leaving.send(signal.SIGTERM)
    assert leaving.wait(15) == 0, leaving.log_tail()
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0, "a planned leave duplicated events"
    assert "hands queue" in log_of(deployment, "client-a")


def test_kill_9_is_taken_over_before_the_broker_timeout(
    make_group, deployment: LocalDeployment, validate, broker: BrokerEndpoint
) -> None:
    make_group()
    victim = member(deployment, "client-a")
    member(deployment, "client-b")
    publisher = load(deployment)
    wait_for(lambda: serving(deployment, "client-a"), 15, "client-a never became active")
    time.sleep(2.0)
    killed_at = time.time()
    victim.send(signal.SIGKILL)
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    survivor = log_of(deployment, "client-b")
    assert "member client-a is gone" in survivor
    takeover = min(t for t in times_of(survivor, "now serves queue") if t > killed_at)
    assert takeover - killed_at < BROKER_TIMEOUT, "the survivor waited for the broker's timeout"
    if broker.kind in ("nats", "rabbitmq"):  # the broker said so, not the lease
        assert "member client-a is gone (connection closed)" in survivor


def test_a_stopped_member_loses_its_queues_and_fences_itself_on_waking(
    make_group, deployment: LocalDeployment, validate
) -> None:
    make_group()
    sleeper = member(deployment, "client-a")
    member(deployment, "client-b")
    publisher = load(deployment, 9.0)
    wait_for(lambda: serving(deployment, "client-a"), 15, "client-a never became active")
    time.sleep(2.0)
    sleeper.send(signal.SIGSTOP)
    time.sleep(2.5)
    sleeper.send(signal.SIGCONT)
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    # On waking it fences itself, by whichever it meets first: its tick (own heartbeats
    # lapsed) or an old heartbeat's late echo (own lease lapsed before it came back).
    assert "; fencing its queues" in log_of(deployment, "client-a")
    assert "member client-a is gone" in log_of(deployment, "client-b")


@pytest.fixture
def hanging_handler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A handler that hangs for 4 s in client-a on the first event of the key 'hang'."""
    (tmp_path / "hanging_handler.py").write_text(
        textwrap.dedent(
            """
            import asyncio
            from lbg.handlers import republish

            async def handle(event, context):
                if event.key == "hang" and event.seq == 1 and context.client == "client-a":
                    await asyncio.sleep(4)
                await republish(event, context)
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "hanging_handler:handle"


def test_a_handler_hung_past_the_stall_timeout_gives_the_queues_up(
    make_group, deployment: LocalDeployment, validate, hanging_handler: str, tmp_path: Path
) -> None:
    make_group()
    member(deployment, "client-a", "--handler", hanging_handler, "--stall-timeout", "1")
    time.sleep(1.5)
    member(deployment, "client-b", "--handler", hanging_handler, "--stall-timeout", "1")
    time.sleep(1.0)
    events = tmp_path / "events.jsonl"
    keys = ["hang"] + [f"key-{i}" for i in range(40)]
    events.write_text("".join(f'{{"key": "{k}"}}\n' for _ in range(20) for k in keys))
    publisher = deployment.start_publisher("pub", "--input", str(events), "--rate", "200")
    assert publisher.wait(60) == 0, publisher.log_tail()

    report = validate()

    assert report["lost"] == 0
    assert report["reordered"] == 0
    logs = log_of(deployment, "client-a") + log_of(deployment, "client-b")
    assert "is stalled" in logs, "no member noticed its hung handler"


@pytest.fixture
def recording_hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A handler module whose on_assigned / on_revoked hooks append to a journal file."""
    journal = tmp_path / "journal.txt"
    (tmp_path / "recording_hooks.py").write_text(
        textwrap.dedent(
            f"""
            import os, time
            from lbg.handlers import republish as handle

            def _note(what, queues):
                with open({str(journal)!r}, "a") as out:
                    for queue in queues:
                        out.write(f"{{time.monotonic()}} {{os.getpid()}} {{what}} {{queue}}\\n")

            def on_assigned(queues):
                _note("assigned", queues)

            async def on_revoked(queues):
                _note("revoked", queues)
            """
        )
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    return "recording_hooks:handle", journal


def test_hooks_tell_a_handover_in_order(
    make_group, deployment: LocalDeployment, validate, recording_hooks
) -> None:
    handler, journal = recording_hooks
    make_group()
    first = member(deployment, "client-a", "--handler", handler)
    # Events flow until client-b serves: on NATS a new owner learns it is one from its first
    # delivery (a 5 s load had ended before a slow start joined, and nothing ever told it).
    publisher = load(deployment, 60.0)
    wait_for(lambda: serving(deployment, "client-a"), 15, "client-a never became active")
    time.sleep(1.0)
    second = member(deployment, "client-b", "--handler", handler)
    wait_for(lambda: serving(deployment, "client-b"), 10, "client-b got no queue")
    publisher.send(signal.SIGTERM)
    assert publisher.wait(60) == 0, publisher.log_tail()
    report = validate()
    assert report["lost"] == 0 and report["reordered"] == 0

    events = [line.split() for line in journal.read_text().splitlines()]
    by = {str(first.process.pid): "a", str(second.process.pid): "b"}
    moved = {int(q) for _, pid, what, q in events if by[pid] == "b" and what == "assigned"}
    assert moved, "client-b was never told it was assigned a queue"
    for queue in moved:
        revoked = [
            float(t) for t, pid, w, q in events if (by[pid], w, int(q)) == ("a", "revoked", queue)
        ]
        assigned = [
            float(t) for t, pid, w, q in events if (by[pid], w, int(q)) == ("b", "assigned", queue)
        ]
        assert revoked and min(revoked) < min(assigned), f"queue {queue}: revoked after assigned"


def test_a_group_that_went_quiet_serves_its_next_events_in_order(
    make_group, deployment: LocalDeployment, validate, broker: BrokerEndpoint
) -> None:
    """On NATS an owner sent nothing for 15 priority timeouts gives its pin back and waits with
    one long pull (binding.QUIET_TIMEOUTS); when the events come again each queue is taken by
    its owner again, with nothing lost, duplicated or reordered."""
    if broker.kind != "nats":
        pytest.skip("only NATS owners give their pins back when quiet")
    make_group("--priority-timeout", "0.4")  # quiet after 6 s
    member(deployment, "client-a")
    member(deployment, "client-b")
    first = deployment.start_publisher("pub1", "--keys", "60", "--rate", "400", "--duration", "2")
    assert first.wait(60) == 0, first.log_tail()
    quiet = "quiet: its pin goes back"
    wait_for(
        lambda: all(quiet in log_of(deployment, n) for n in ("client-a", "client-b")),
        20,
        "the owners never gave their pins back",
    )
    again = deployment.start_publisher("pub2", "--keys", "60", "--rate", "400", "--duration", "2")
    assert again.wait(60) == 0, again.log_tail()

    report = validate()

    assert (report["lost"], report["reordered"], report["duplicates"]) == (0, 0, 0)
    assert set(report["per_client"]) == {"client-a", "client-b"}
    for name in ("client-a", "client-b"):
        log = log_of(deployment, name)
        given_back = max(times_of(log, quiet))
        assert any(t > given_back for t in times_of(log, "now serves queue")), name
