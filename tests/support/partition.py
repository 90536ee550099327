"""A network partition for one client, without kernel tooling: a TCP proxy on loopback.

The client under test connects to the broker through `Partition.url`; `cut()` stops
forwarding in both directions while every socket stays open (the process lives on and its
writes go into buffers, as behind an iptables DROP), `heal()` forwards again whatever was
held. Connections made during a cut are accepted and held until the heal. Only loopback
addresses are used: the proxy listens on 127.0.0.1 and forwards to the broker's own address.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from urllib.parse import urlsplit, urlunsplit

CHUNK = 65536


class Partition:
    """A freezable TCP proxy in front of one broker URL, run on its own thread and loop."""

    def __init__(self, broker_url: str) -> None:
        parts = urlsplit(broker_url)
        if parts.hostname not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"partitions are made on loopback only, not {parts.hostname}")
        self._parts = parts
        self._target = (parts.hostname, parts.port)
        self._loop = asyncio.new_event_loop()
        self._open = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._call(self._listen())

    @property
    def url(self) -> str:
        """The broker URL with the proxy's port: give it to the client to partition."""
        netloc = self._parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{self.port}"
        netloc[-1] = host
        return urlunsplit(self._parts._replace(netloc="@".join(netloc)))

    def cut(self) -> None:
        """Stop forwarding both ways; keep every connection open."""
        self._loop.call_soon_threadsafe(self._open.clear)

    def heal(self) -> None:
        """Forward again, held bytes first."""
        self._loop.call_soon_threadsafe(self._open.set)

    def close(self) -> None:
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _call(self, coroutine):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _listen(self) -> int:
        self._open.set()
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self._writers.add(client_w)
        try:
            await self._open.wait()
            broker_r, broker_w = await asyncio.open_connection(*self._target)
        except OSError:
            client_w.close()
            self._writers.discard(client_w)
            return
        self._writers.add(broker_w)
        await asyncio.gather(self._pump(client_r, broker_w), self._pump(broker_r, client_w))
        for writer in (client_w, broker_w):
            writer.close()
            self._writers.discard(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction while the partition is open; on EOF close the other side."""
        with contextlib.suppress(OSError, asyncio.CancelledError):
            while True:
                await self._open.wait()
                data = await reader.read(CHUNK)
                await self._open.wait()
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()
