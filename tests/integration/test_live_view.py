"""The validator's live view, opened in headless Chromium while the demo runs.

The screenshot is kept as a test artifact in var/test-artifacts/live-view.png.
"""

import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import orjson
import pytest

from lbg.devstack.deployment import script
from lbg.devstack.embedded import free_port

ARTIFACTS = Path(__file__).parents[2] / "var" / "test-artifacts"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


def chromium(tmp_path: Path, *args: str) -> str:
    """Run headless Chromium (Debian's package; `make test` installs it) and return stdout."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is not installed (make test installs Debian's chromium package)")
    result = subprocess.run(
        [binary, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return result.stdout


def state(port: int) -> dict:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(f"http://127.0.0.1:{port}/api/state", timeout=5) as response:
        return orjson.loads(response.read())


def test_live_view_shows_one_active_client_per_queue_and_the_handovers(tmp_path: Path) -> None:
    port = free_port()
    demo = subprocess.Popen(
        [script("lbg"), "demo", "--duration", "15", "--rate", "300", "--web-port", str(port),
         "--workdir", str(tmp_path / "demo")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                current = state(port)
                if len(current["owners"]) == 4 and current["uptime"] > 6:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "the live view never showed every queue"
            time.sleep(0.5)
        url = f"http://127.0.0.1:{port}/"
        dom = chromium(tmp_path, "--virtual-time-budget=2000", "--dump-dom", url)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        screenshot = ARTIFACTS / "live-view.png"
        chromium(tmp_path, "--window-size=1000,800", f"--screenshot={screenshot}", url)
    finally:
        output, _ = demo.communicate(timeout=120)
    assert demo.returncode == 0, output
    assert current["rate"] > 0, "records flowed but the live view showed 0 records/s"

    rows = re.findall(r'<tr data-queue="(\d+)">(.*?)</tr>', dom)
    assert [int(q) for q, _ in rows] == [0, 1, 2, 3], dom
    for queue, row in rows:
        active = re.findall(r'<td class="active" data-client="([^"]+)">', row)
        assert len(active) == 1, f"queue {queue} shows {active} as active"
    assert re.search(r'data-field="lost"><b>(0|\?)</b>', dom), dom
    assert re.search(r'data-field="reordered"><b>0</b>', dom), dom
    assert re.search(r"queue \d: - -&gt; client-\d", dom), "no handover in the timeline"
    assert screenshot.stat().st_size > 10_000
