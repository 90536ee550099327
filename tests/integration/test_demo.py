"""The main job, run as a newcomer would: `lbg demo` on its own embedded NATS broker, and
on the suite's RabbitMQ (`lbg demo --broker-url ... --admin-url ...`)."""

import subprocess

import orjson
import pytest

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import script


@pytest.mark.parametrize("mode", ["dynamic", "static"])
def test_short_demo_ends_with_nothing_lost_or_reordered(
    tmp_path, mode: str, broker: BrokerEndpoint
) -> None:
    # On NATS the demo starts its own embedded broker, as `make demo` does.
    target = [] if broker.kind == "nats" else ["--broker-url", broker.url, *broker.admin_args()]
    result = subprocess.run(
        [
            script("lbg"),
            "demo",
            *target,
            "--mode",
            mode,
            "--duration",
            # Each phase must outlast a client's start-up (about 1-2 s on a busy 2-core
            # machine: process, connect, join), or a client added late never serves.
            "24",
            "--cycle-seconds",
            "2",
            "--rate",
            "300",
            "--workdir",
            str(tmp_path),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    report = orjson.loads(lines[-1])
    assert report["published"] > 3000
    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["unique"] == report["published"]
    timeline = result.stdout
    assert "kill -9 client-1" in timeline
    for client in ("client-2", "client-3"):
        assert f"-> {client}" in timeline, f"{client} never served a queue:\n{timeline}"
