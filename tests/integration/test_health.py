"""/healthz and /readyz on the metrics port, answered by each daemon's own event loop:
healthy and ready on a live broker; still alive but not ready once the broker is gone, and
ready again when it is back."""

import time
import urllib.error
import urllib.request
from pathlib import Path

import orjson
from tests.support.processes import cli

from lbg.devstack.deployment import LocalDeployment
from lbg.devstack.embedded import EmbeddedNats, free_port


def probe(port: int, path: str) -> tuple[int, dict]:
    """The status and JSON body of GET http://127.0.0.1:<port><path> (0 if nothing answers)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://127.0.0.1:{port}{path}", timeout=3) as response:
            return response.status, orjson.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, orjson.loads(exc.read())
    except OSError:
        return 0, {}


def wait_for(port: int, path: str, status: int, timeout: float = 30) -> dict:
    """Probe until `path` answers `status`; its body."""
    deadline = time.monotonic() + timeout
    while True:
        code, body = probe(port, path)
        if code == status:
            return body
        assert time.monotonic() < deadline, f"{path} on :{port} stayed {code} {body}"
        time.sleep(0.2)


def test_health_and_readiness_follow_the_broker(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    url = server.start()
    try:
        cli("cg-admin", "--broker-url", url, "create", "--group", "health",
            "--hash-count", "8", "--queue-count", "2")  # fmt: skip
        local = LocalDeployment(url, "health", tmp_path / "daemons")
        ports = {"client": free_port(), "validator": free_port(), "publisher": free_port()}
        local.start("client", "lbg-client", "--metrics-port", str(ports["client"]))
        local.start("validator", "validation-client", "--metrics-port", str(ports["validator"]))
        local.start_publisher(
            "publisher", "--rate", "20", "--metrics-port", str(ports["publisher"])
        )
        try:
            for name, port in ports.items():
                assert wait_for(port, "/readyz", 200)["status"] == "ok", name
                body = wait_for(port, "/healthz", 200)
                assert 0 <= body["loop_lag_seconds"] < 1, name
                assert body["broker_connected_group_bound"] is True, name
            server.stop()
            for name, port in ports.items():
                body = wait_for(port, "/readyz", 503)
                assert body == {"status": "failing", "broker_connected_group_bound": False}, name
                status, body = probe(port, "/healthz")
                assert status == 200, f"{name}: the loop itself is alive"
                assert body["broker_connected_group_bound"] is False, f"{name}: says the broker"
            server.start()
            for port in ports.values():
                wait_for(port, "/readyz", 200, timeout=60)
        finally:
            local.stop_all()
    finally:
        server.stop()
