"""A NATS client starts without loading aiohttp (nats-py's websocket transport, which the
adapter never uses: a large share of a client's start), and aiohttp still loads for the
metrics server afterwards."""

import subprocess
import sys

PROBE = """
import sys
import lbg.cli.client, lbg.broker.nats.adapter
print("aiohttp" in sys.modules)
from aiohttp import web
print(web.Application.__name__)
"""


def test_the_nats_adapter_loads_without_aiohttp_which_stays_importable() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["False", "Application"]
