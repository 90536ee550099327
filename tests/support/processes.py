"""Running the project's commands from tests: one-shot CLIs and the validator to completion."""

import contextlib
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import orjson

from lbg.devstack.deployment import Daemon, LocalDeployment, script


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run one of the project's commands to completion and capture its output."""
    result = subprocess.run(
        [script(args[0]), *args[1:]], capture_output=True, text=True, timeout=60
    )
    if check and result.returncode != 0:
        raise AssertionError(f"{args} failed ({result.returncode}): {result.stderr}")
    return result


@contextlib.contextmanager
def resizable_group(url: str, queue_count: int) -> Iterator[str]:
    """A fresh group (HC 24) created with cg-admin for a resize test; deleted after."""
    name = f"r{uuid.uuid4().hex[:10]}"
    create = ("create", "--group", name, "--hash-prefix", name, "--hash-count", "24")
    cli("cg-admin", "--broker-url", url, *create, "--queue-count", str(queue_count))
    try:
        yield name
    finally:
        cli("cg-admin", "--broker-url", url, "delete", name, check=False)


def run_validator(deployment: LocalDeployment, timeout: float = 60.0) -> dict:
    """Run the validation client until every published event is accounted for; its report."""
    report = deployment.workdir / "report.json"
    validator = deployment.start(
        "validator",
        "validation-client",
        "--idle-exit",
        "2",
        "--progress-interval",
        "0",
        "--report-json",
        str(report),
    )
    code = validator.wait(timeout)
    assert code == 0, validator.log_tail()
    return orjson.loads(report.read_bytes())


def under_load(local: LocalDeployment, fault: Callable[[], None], settle: float) -> dict:
    """Two clients and a publisher (40 keys, 200 events/s); `fault` hits after `settle`
    seconds of publishing, the load goes on `settle` seconds more; then the validator's report."""
    try:
        for name in ("client-a", "client-b"):
            local.start(name, "lbg-client", "--id", name)
        publisher = local.start_publisher("pub", "--keys", "40", "--rate", "200")
        wait_for_log(publisher, "-> group")
        time.sleep(settle)
        fault()
        time.sleep(settle)
        publisher.send(signal.SIGTERM)
        assert publisher.wait(60) == 0, publisher.log_tail()
        return run_validator(local, timeout=120)
    finally:
        local.stop_all()


def parked_lines(local: LocalDeployment) -> list[str]:
    """The clients' "key ... parked" log lines: events a run did not lose but parked (the
    validator counts them as neither lost nor unique), to show when a count falls short."""
    return [
        line
        for name, daemon in local.daemons.items()
        if name.startswith("client") and daemon.log_path.exists()
        for line in daemon.log_path.read_text(errors="replace").splitlines()
        if " parked" in line and "key " in line
    ]


def wait_for_log(daemon: Daemon, text: str, timeout: float = 30.0) -> None:
    """Wait until the daemon's log holds `text` (it got that far), or fail with its tail."""
    deadline = time.monotonic() + timeout
    while text not in daemon.log_path.read_text(errors="replace"):
        assert daemon.running and time.monotonic() < deadline, daemon.log_tail()
        time.sleep(0.1)
