"""Scaling at run time on every broker: `lbg local scale` and `lbg autoscale` under load."""

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import script
from lbg.devstack.scaling import LocalStack, alive


def lbg(*args: str, timeout: float = 60) -> str:
    result = subprocess.run(
        [script("lbg"), *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def finish(stack: LocalStack, broker: BrokerEndpoint, group: str) -> dict:
    """Stop publishing, validate to the end, stop the stack: the validator's report."""
    state = stack.load()
    publisher = state.others["publisher"]
    os.kill(publisher, signal.SIGTERM)
    deadline = time.monotonic() + 30
    while alive(publisher):
        assert time.monotonic() < deadline, "the publisher did not stop"
        time.sleep(0.1)
    report = stack.folder / "report.json"
    subprocess.run(
        [script("validation-client"), "--broker-url", broker.url, "--group", group,
         "--idle-exit", "2", "--progress-interval", "0", "--report-json", str(report)],
        capture_output=True, timeout=90, check=True,
    )  # fmt: skip
    lbg("local", "down", "--folder", str(stack.folder))
    subprocess.run(
        [script("cg-admin"), "--broker-url", broker.url, *broker.admin_args(), "delete", group],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    return orjson.loads(report.read_bytes())


@pytest.fixture
def stacks() -> Iterator[list[LocalStack]]:
    """Stacks a test started; any still up at the end (a failed test) are stopped."""
    started: list[LocalStack] = []
    yield started
    for stack in started:
        if stack.state_path.exists():
            stack.down(verdict_timeout=0)


def up(
    stacks: list[LocalStack],
    folder: Path,
    broker: BrokerEndpoint,
    group: str,
    clients: int,
    rate: int,
) -> LocalStack:
    stacks.append(LocalStack(folder))
    lbg(
        "local", "up", "--folder", str(folder), "--broker-url", broker.url, *broker.admin_args(),
        "--group", group, "--clients", str(clients), "--rate", str(rate), "--keys", "50",
    )  # fmt: skip
    return stacks[-1]


def test_scale_up_and_down_under_load_moves_queues_without_loss(
    broker: BrokerEndpoint, group_name: str, tmp_path: Path, stacks: list[LocalStack]
) -> None:
    stack = up(stacks, tmp_path / "stack", broker, group_name, clients=1, rate=300)
    time.sleep(2)
    assert "started client-1, client-2" in lbg("local", "scale", "--folder", str(stack.folder), "3")
    time.sleep(3)
    before = stack.running_clients(stack.load())
    assert sorted(before) == ["client-0", "client-1", "client-2"]
    assert "stopped client-2, client-1" in lbg("local", "scale", "--folder", str(stack.folder), "1")
    after = stack.running_clients(stack.load())
    assert after == {"client-0": before["client-0"]}, "scaling down restarted the survivor"
    time.sleep(2)

    report = finish(stack, broker, group_name)

    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0, "planned scaling duplicated events"
    assert set(report["per_client"]) == {"client-0", "client-1", "client-2"}


def test_autoscale_adds_clients_for_a_backlog_and_removes_them_after(
    broker: BrokerEndpoint, group_name: str, tmp_path: Path, stacks: list[LocalStack]
) -> None:
    # No client yet: the backlog builds up; the autoscaler starts at its minimum and adds more.
    stack = up(stacks, tmp_path / "stack", broker, group_name, clients=0, rate=0)
    publisher = subprocess.run(
        [script("hashed-publisher"), "--broker-url", broker.url, "--group", group_name,
         "--keys", "50", "--count", "10000", "--no-summary", "-q"],
        capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert publisher.returncode == 0, publisher.stderr
    autoscaler = subprocess.Popen(
        [script("lbg"), "autoscale", "--folder", str(stack.folder), "--min", "1", "--max", "3",
         "--high", "50", "--low", "5", "--cooldown", "1", "--calm", "2", "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        peak, deadline = 1, time.monotonic() + 120  # 10,000 events to drain on a busy machine
        while time.monotonic() < deadline:
            count = len(stack.running_clients(stack.load()))
            peak = max(peak, count)
            if peak > 1 and count == 1:
                break
            time.sleep(0.3)
    finally:
        autoscaler.send_signal(signal.SIGTERM)
        log, _ = autoscaler.communicate(timeout=30)
    lbg("local", "down", "--folder", str(stack.folder))
    subprocess.run(
        [script("cg-admin"), "--broker-url", broker.url, *broker.admin_args(), "delete",
         group_name], capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    assert peak > 1, f"the autoscaler never added a client:\n{log}"
    assert count == 1, f"the autoscaler did not scale back down:\n{log}"
    assert "held back by the calm" in log, f"no hold before the scale-down in the log:\n{log}"
