"""The README's first hour: `lbg local up` on its embedded broker, the operator commands finding
it from the same folder, its live view and metrics, `lbg local down`'s verdict, a fresh rerun."""

import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from lbg.cli.localstate import DEFAULT_FOLDER
from lbg.devstack.deployment import script
from lbg.devstack.embedded import free_port
from lbg.devstack.scaling import LocalStack


def lbg(cwd: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `lbg ARGS` in `cwd` (where the stack's var/local is), as a user would."""
    result = subprocess.run(
        [script("lbg"), *args], cwd=cwd, capture_output=True, text=True, timeout=90, check=False
    )
    assert not check or result.returncode == 0, result.stderr
    return result


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read()


def wait_for(url: str, timeout: float = 30.0) -> bytes:
    """GET `url` once it answers (the daemons start in the background)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fetch(url)
        except OSError:
            assert time.monotonic() < deadline, f"nothing served at {url}"
            time.sleep(0.3)


@pytest.fixture
def here(tmp_path: Path) -> Iterator[Path]:
    """A folder to run the stack from; whatever still runs at the end is stopped."""
    yield tmp_path
    stack = LocalStack(tmp_path / DEFAULT_FOLDER)
    if stack.state_path.exists():
        stack.down(verdict_timeout=0)


def test_up_status_route_live_view_metrics_and_down_with_its_verdict(here: Path) -> None:
    web, metrics = free_port(), free_port()
    up = lbg(here, "local", "up", "--rate", "50", "--keys", "20", "--web-port", str(web),
             "--metrics-port", str(metrics))  # fmt: skip
    assert f"http://127.0.0.1:{web}/" in up.stdout

    # No --broker-url: the operator commands find the stack running from this folder.
    status = lbg(here, "status", "--group", "local", "--listen", "1")
    assert "queue" in status.stdout, status.stdout
    assert lbg(here, "status").stdout.startswith("group 'local'"), "no --group: the stack's"
    route = lbg(here, "route", "--group", "local", "some-key")
    assert route.stdout.startswith("some-key\t"), route.stdout
    # scale returns once the new client joined: it can take a queue at once.
    assert "started client-2" in lbg(here, "local", "scale", "3").stdout
    moved = lbg(here, "move", "--group", "local", "0", "client-2")
    assert "-> client-2" in moved.stdout or "already served by client-2" in moved.stdout
    missing = lbg(here, "status", "--group", "nosuch", check=False)
    state = orjson.loads((here / DEFAULT_FOLDER / "state.json").read_bytes())
    assert missing.returncode != 0
    assert f"{state['broker_url']}: group 'nosuch' does not exist" in missing.stderr

    assert b"<html" in wait_for(f"http://127.0.0.1:{web}/").lower()
    assert b"lbg_validator_delivered" in wait_for(f"http://127.0.0.1:{metrics}/metrics")
    assert b"lbg_publisher_acked_total" in wait_for(f"http://127.0.0.1:{metrics + 1}/metrics")

    down = lbg(here, "local", "down")
    lines = down.stdout.splitlines()
    assert any(line.split() == ["lost", "0"] for line in lines), down.stdout
    assert any(line.split() == ["reordered", "0"] for line in lines), down.stdout
    assert any(line.split() == ["result", "OK"] for line in lines), down.stdout


def test_a_second_up_starts_afresh(here: Path) -> None:
    folder = here / DEFAULT_FOLDER
    lbg(here, "local", "up", "--rate", "50", "--keys", "10", "--clients", "1")
    time.sleep(2)
    first = lbg(here, "local", "down").stdout
    published = next(line.split()[1] for line in first.splitlines() if line.startswith("published"))
    (folder / "client-7.log").write_text("a client of an older run\n")

    lbg(here, "local", "up", "--rate", "0", "--clients", "1")

    assert not (folder / "client-7.log").exists(), "an old client log was kept"
    assert "finished:" not in (folder / "validator.log").read_text(), (
        "the old validator log was kept"
    )
    report = lbg(here, "local", "down").stdout
    assert int(published) > 0
    assert any(line.split() == ["delivered", "0"] for line in report.splitlines()), report
