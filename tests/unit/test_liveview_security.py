"""The live view answers only requests that name this machine, with headers that keep
other sites from reading, framing or sniffing it, and warns when it is reachable."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import re

import httpx
import pytest

from lbg.devstack.embedded import free_port
from lbg.liveview import LiveView, page_html, serve_live_view
from lbg.model.sequence import Report


class Counts:
    """Stands in for the validator: the live view reads only its report and parked events."""

    parked: dict[str, set[int]] = {}  # noqa: RUF012 (read only)

    def report(self) -> Report:
        return Report(None, 0, 0, None, 0, 0, 0, 0, 0, 0)


async def answers(address: str, hosts: list[str]) -> list[httpx.Response]:
    port = free_port()
    runner = await serve_live_view(LiveView("g"), Counts(), port, address)  # type: ignore[arg-type]
    try:
        async with httpx.AsyncClient(trust_env=False) as http:
            url = f"http://127.0.0.1:{port}/api/state"
            return [await http.get(url, headers={"Host": host}) for host in hosts]
    finally:
        await runner.cleanup()


def test_a_rebound_dns_name_is_refused_and_every_answer_carries_the_headers() -> None:
    own = ["127.0.0.1:8080", "localhost:8080", "[::1]:8080"]
    refused, *served = asyncio.run(answers("127.0.0.1", ["attacker.example:8080", *own]))
    assert refused.status_code == 421
    assert [r.status_code for r in served] == [200, 200, 200]
    for response in (refused, *served):
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert response.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]


def test_the_policy_allows_exactly_the_pages_inline_script_and_style() -> None:
    (response,) = asyncio.run(answers("127.0.0.1", ["127.0.0.1"]))
    policy = response.headers["Content-Security-Policy"]
    for kind in ("script", "style"):
        body = re.search(rf"<{kind}>(.*?)</{kind}>".encode(), page_html(), re.S)
        assert body is not None
        digest = base64.b64encode(hashlib.sha256(body.group(1)).digest()).decode()
        assert f"{kind}-src 'sha256-{digest}';" in policy


@pytest.mark.parametrize(("address", "warned"), [("127.0.0.1", False), ("0.0.0.0", True)])
def test_binding_beyond_loopback_is_warned_about(
    address: str, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="lbg.liveview"):
        asyncio.run(answers(address, ["127.0.0.1"]))
    assert any("no authentication" in r.message for r in caplog.records) is warned
