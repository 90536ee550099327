"""A PostgreSQL that refuses a connection for max_connections: the one-line error says what
a group needs (a few connections per client, whatever its queue count)."""

import asyncio
import struct

import pytest

from lbg.broker.base import BrokerError
from lbg.broker.messagedb.adapter import MessageDbBroker
from lbg.settings import BrokerSettings


def error_response(code: str, message: str) -> bytes:
    """A PostgreSQL ErrorResponse: severity, SQLSTATE and message fields."""
    fields = b"".join(
        kind + text.encode() + b"\0"
        for kind, text in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", code), (b"M", message))
    )
    body = fields + b"\0"
    return b"E" + struct.pack("!I", len(body) + 4) + body


async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer an SSL request with 'no', then the startup message as a full server does."""
    while True:
        size = struct.unpack("!I", await reader.readexactly(4))[0]
        packet = await reader.readexactly(size - 4)
        if packet[:4] == struct.pack("!I", 80877103):  # SSLRequest
            writer.write(b"N")
            continue
        writer.write(error_response("53300", "sorry, too many clients already"))
        await writer.drain()
        writer.close()
        return


def test_a_full_server_is_refused_in_one_line_that_says_what_a_group_needs() -> None:
    async def connect() -> str:
        server = await asyncio.start_server(refuse, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = BrokerSettings(url=f"postgresql://lbg@127.0.0.1:{port}/db", connect_timeout=5)
        try:
            with pytest.raises(BrokerError) as refused:
                await MessageDbBroker.connect(settings, "client")
        finally:
            server.close()
        return str(refused.value)

    message = asyncio.run(connect())
    assert "\n" not in message
    assert "too many clients" in message
    assert "max_connections" in message and "clients x 10" in message
