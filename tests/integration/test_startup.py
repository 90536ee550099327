"""Start-up order does not matter: daemons wait, saying so, for the broker and for their group.

`[broker] connect_retry_for` bounds the wait (with capped, jittered backoff); 0 keeps the
fail-fast behaviour: one line naming the broker or the group, and a non-zero exit.
"""

import signal
import subprocess
import time
import uuid
from pathlib import Path

import orjson
import pytest

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import Daemon, LocalDeployment, script
from lbg.devstack.embedded import EmbeddedNats, free_port
from lbg.settings import BrokerSettings

# Daemon, and flags that let it run to completion on an empty group.
DAEMONS = {
    "lbg-client": ["--client-index", "0", "--client-count", "1"],
    "hashed-publisher": ["--count", "1"],
    "validation-client": ["--idle-exit", "1"],
}


def write_config(tmp_path: Path, broker: str) -> Path:
    """A config file whose [broker] section holds `broker` (the rest: defaults)."""
    path = tmp_path / f"startup-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(f"[broker]\n{broker}\n", encoding="utf-8")
    return path


def shown(url: str) -> str:
    """The broker URL as log lines show it (password masked)."""
    return BrokerSettings(url=url).shown_url


def run(program: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script(program), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def wait_for_log(daemon: Daemon, text: str, timeout: float = 20) -> None:
    """Wait until the daemon's log holds `text` (it must keep running meanwhile)."""
    deadline = time.monotonic() + timeout
    while text not in daemon.log_path.read_text(errors="replace"):
        assert daemon.running, f"{daemon.name} stopped:\n{daemon.log_tail()}"
        assert time.monotonic() < deadline, f"{daemon.name} never logged {text!r}:\n" + (
            daemon.log_tail()
        )
        time.sleep(0.1)


def create_group(url: str, group: str, *admin_args: str) -> None:
    result = run(
        "cg-admin",
        *("--broker-url", url, *admin_args, "create", "--group", group),
        *("--hash-prefix", group, "--hash-count", "16", "--queue-count", "2"),
    )
    assert result.returncode == 0, result.stderr


def validate(deployment: LocalDeployment) -> dict:
    """Run validation-client until every published event is accounted for; its report."""
    report = deployment.workdir / "report.json"
    validator = deployment.start(
        "validator",
        "validation-client",
        *("--idle-exit", "2", "--progress-interval", "0", "--report-json", str(report)),
    )
    assert validator.wait(60) == 0, validator.log_tail()
    return orjson.loads(report.read_bytes())


def assert_processed_in_order(deployment: LocalDeployment, count: int) -> None:
    report = validate(deployment)
    assert report["published"] == count
    assert report["unique"] == count
    assert (report["lost"], report["reordered"], report["duplicates"]) == (0, 0, 0)
    assert report["per_client"] == {"client-a": count}
    for daemon in deployment.daemons.values():
        assert "Traceback" not in daemon.log_path.read_text(), daemon.log_tail(60)


# --- a group that does not exist (yet) ---------------------------------------------------------


def test_daemons_wait_for_a_group_created_after_they_started(
    make_group, deployment: LocalDeployment, broker: BrokerEndpoint, tmp_path: Path
) -> None:
    config = str(write_config(tmp_path, "connect_retry_for = 60"))
    client = deployment.start_client("client-a", 0, 1, 600, "--config", config)
    publisher = deployment.start_publisher(
        "pub", "--config", config, "--keys", "10", "--count", "300"
    )
    waiting = f"waiting for group '{deployment.group}' on {shown(broker.url)}"
    wait_for_log(client, waiting)
    wait_for_log(publisher, waiting)
    wait_for_log(client, "(attempt 2)")

    make_group()

    assert publisher.wait(60) == 0, publisher.log_tail()
    assert client.running, client.log_tail()
    assert_processed_in_order(deployment, 300)


def test_a_daemon_waiting_for_its_group_stops_at_once_on_sigterm(
    deployment: LocalDeployment, broker: BrokerEndpoint, tmp_path: Path
) -> None:
    config = str(write_config(tmp_path, "connect_retry_for = 600"))
    client = deployment.start_client("client-a", 0, 1, 600, "--config", config)
    wait_for_log(client, f"waiting for group '{deployment.group}'")

    client.send(signal.SIGTERM)

    assert client.wait(5) == 0, client.log_tail()
    assert "Traceback" not in client.log_path.read_text(), client.log_tail(60)


@pytest.mark.parametrize("program", DAEMONS)
def test_a_missing_group_without_retries_is_one_line_naming_group_and_broker(
    program: str, broker: BrokerEndpoint, group_name: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, "connect_retry_for = 0")
    started = time.monotonic()

    result = run(
        program,
        *("--config", str(config), "--broker-url", broker.url, "--group", group_name, "-q"),
        *DAEMONS[program],
    )

    assert time.monotonic() - started < 15
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"{shown(broker.url)}: group '{group_name}' does not exist" in lines[0]


def test_a_missing_group_is_given_up_on_after_connect_retry_for(
    broker: BrokerEndpoint, group_name: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, "connect_retry_for = 2")

    result = run(
        "hashed-publisher",
        *("--config", str(config), "--broker-url", broker.url, "--group", group_name, "-q"),
    )

    assert result.returncode != 0
    *retries, last = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stderr, result.stderr
    assert retries and all(f"waiting for group '{group_name}'" in line for line in retries)
    assert "retrying for up to 2 s" in retries[0] and "(attempt 1)" in retries[0]
    assert f"{shown(broker.url)}: group '{group_name}' does not exist" in last
    assert "gave up after" in last and "connect_retry_for = 2" in last


# --- a broker that is down at start-up (NATS: the test owns that server) ------------------------


def test_daemons_started_before_the_broker_connect_once_it_is_up(tmp_path: Path) -> None:
    port = free_port()
    url = f"nats://127.0.0.1:{port}"
    group = f"t{uuid.uuid4().hex[:10]}"
    config = str(write_config(tmp_path, "connect_timeout = 1\nconnect_retry_for = 60"))
    deployment = LocalDeployment(url, group, tmp_path / "daemons")
    server = EmbeddedNats(tmp_path / "nats", port=port)
    try:
        client = deployment.start_client("client-a", 0, 1, 600, "--config", config)
        publisher = deployment.start_publisher(
            "pub", "--config", config, "--keys", "10", "--count", "300"
        )
        for daemon in (client, publisher):
            wait_for_log(daemon, f"broker unreachable: cannot connect to {url}")
            wait_for_log(daemon, "(attempt 2)")
        assert "retrying in" in client.log_path.read_text()

        server.start()
        create_group(url, group)

        assert publisher.wait(60) == 0, publisher.log_tail()
        assert client.running, client.log_tail()
        assert_processed_in_order(deployment, 300)
    finally:
        deployment.stop_all()
        server.stop()


@pytest.mark.parametrize("program", DAEMONS)
def test_an_unreachable_broker_is_given_up_on_after_connect_retry_for(
    program: str, tmp_path: Path
) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    config = write_config(tmp_path, "connect_timeout = 0.5\nconnect_retry_for = 2")
    started = time.monotonic()

    result = run(program, "--config", str(config), "--broker-url", url, "-q", *DAEMONS[program])

    assert time.monotonic() - started < 10
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    *retries, last = result.stderr.strip().splitlines()
    assert retries and all(f"broker unreachable: cannot connect to {url}" in r for r in retries)
    assert f"cannot connect to {url}" in last and "gave up after" in last


@pytest.mark.parametrize("program", DAEMONS)
def test_no_retries_fails_at_once_where_nothing_listens(program: str, tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    config = write_config(tmp_path, "connect_timeout = 1\nconnect_retry_for = 0")
    started = time.monotonic()

    result = run(program, "--config", str(config), "--broker-url", url, "-q", *DAEMONS[program])

    assert time.monotonic() - started < 10, "it retried (60 s by default)"
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"cannot connect to {url}: connection refused" in lines[0]
