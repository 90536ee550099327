"""Tell at once when nothing listens where a broker URL points, instead of waiting out the
client library's connect timeout (a refused connection will not start working in 5 s)."""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit

DEFAULT_PORTS = {
    "nats": 4222,
    "tls": 4222,
    "amqp": 5672,
    "amqps": 5671,
    "tcp": 55555,
    "tcps": 55443,
    "postgresql": 5432,
    "postgres": 5432,
}
PROBE_SECONDS = 1.0


def endpoints(url: str) -> list[tuple[str, int]]:
    """The (host, port) pairs a URL names (several for an HA list `nats://a,nats://b`); empty
    when they cannot be read plainly (e.g. a multi-host PostgreSQL URL), so nothing is
    probed."""
    found = []
    for part in url.split(","):
        try:
            split = urlsplit(part.strip())
            port = split.port or DEFAULT_PORTS.get(split.scheme.lower())
        except ValueError:
            return []
        if not split.hostname or port is None:
            return []
        found.append((split.hostname, port))
    return found


async def all_refused(url: str, timeout: float = PROBE_SECONDS) -> bool:
    """Whether every endpoint of `url` refuses a TCP connection (False if any accepts, does
    not answer within `timeout`, or cannot be probed: then the adapter decides)."""
    probes = endpoints(url)
    if not probes:
        return False
    for host, port in probes:
        try:
            _reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except ConnectionRefusedError:
            continue
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return False
    return True
