"""Connecting to nats-server: retries for start-up order, TLS that is really TLS, a server
new enough for the pattern, each user's own reply inbox, and connection trouble in the log."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable

import nats
from nats.aio.client import Client

from lbg.broker.base import BrokerError
from lbg.broker.nats import jsapi
from lbg.settings import BrokerSettings
from lbg.tls import client_context, wants_tls

log = logging.getLogger(__name__)

INBOX_ROOT = "_INBOX"
SUBJECT_TOKEN = re.compile(r"[A-Za-z0-9_-]+")
_REFUSED = re.compile(r'permissions violation for \w+ to "([^"]+)"', re.I)


def inbox_prefix(user: str | None) -> str:
    """Where `user`'s replies (API answers, publish acks, pulled messages) arrive:
    `_INBOX.<user>`, so the server can let each user read its own replies and no one else's.
    Without a user, or one that is not a single subject token, nats-py's shared `_INBOX`."""
    return f"{INBOX_ROOT}.{user}" if user and SUBJECT_TOKEN.fullmatch(user) else INBOX_ROOT


class ConnectionLog:
    """Logs connection trouble, but not the disconnect that our own close causes."""

    def __init__(self) -> None:
        self.closing = False
        self.connected = False
        self.last_error = ""
        self.refused: set[str] = set()
        self.on_reconnect: list[Callable[[], None]] = []
        self.on_disconnect: list[Callable[[], None]] = []

    def refusal(self, subject: str) -> str | None:
        """Why nothing came back for `subject`, if the server refused this user publishing to
        it (a refused request gets no answer at all: the caller only sees a timeout)."""
        if subject.lower() not in self.refused:
            return None
        return f"not permitted: the server refused this user publishing to '{subject}'"

    async def error(self, exc: Exception) -> None:
        self.last_error = " ".join((str(exc) or type(exc).__name__).split())
        denied = _REFUSED.search(self.last_error)
        if denied:
            self.refused.add(denied.group(1).lower())
            log.warning("broker refused: %s", self.last_error)
        elif self.connected:
            log.warning("broker connection error: %s", self.last_error)
        else:
            log.debug("broker not reachable yet: %s", self.last_error)

    async def disconnected(self) -> None:
        if not self.closing:
            log.warning("disconnected from the broker; reconnecting")
            for listener in self.on_disconnect:
                listener()

    async def reconnected(self) -> None:
        log.info("reconnected to the broker")
        for listener in self.on_reconnect:
            listener()


async def connect_nats(settings: BrokerSettings, name: str, events: ConnectionLog) -> Client:
    """Connect, retrying for `connect_timeout` seconds so that start-up order does not matter.

    Once connected, the client reconnects by itself for as long as it runs. TLS (tls://, or
    any tls_* key) verifies the server against `tls_ca_file`, else the system's CAs.
    """
    user, password = settings.login()
    if password is None:
        user = None  # nats-py reads a URL's lone user as a token
    try:
        nc = await asyncio.wait_for(
            nats.connect(
                servers=settings.url.split(","),
                name=name,
                user=user,
                password=password,
                token=settings.token,
                tls=client_context(settings) if wants_tls(settings) else None,
                inbox_prefix=inbox_prefix(user),
                connect_timeout=min(2.0, settings.connect_timeout),
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                reconnect_time_wait=0.5,
                error_cb=events.error,
                disconnected_cb=events.disconnected,
                reconnected_cb=events.reconnected,
            ),
            timeout=settings.connect_timeout,
        )
    except TimeoutError:
        reason = f" ({_explain(events.last_error)})" if events.last_error else ""
        raise BrokerError(
            f"cannot connect to {settings.shown_url} within {settings.connect_timeout:g}s{reason}"
        ) from None
    if wants_tls(settings) and not nc._server_info.get("tls_required"):
        # nats-py talks plain text to a server that does not require TLS, even for tls://.
        await _refuse(
            nc,
            events,
            f"{settings.shown_url}: the server does not require TLS, and TLS was asked for"
            " (tls:// or a tls_* key): refusing to talk to it in plain text",
        )
    version = str(nc._server_info.get("version", ""))
    if jsapi.server_too_old(version):
        await _refuse(
            nc,
            events,
            f"{settings.shown_url} runs nats-server {version}; sticky-lbg needs"
            f" {'.'.join(map(str, jsapi.MIN_SERVER_VERSION))} or newer"
            " (pinned_client priority groups, consumer reset)",
        )
    events.connected = True
    return nc


async def _refuse(nc: Client, events: ConnectionLog, reason: str) -> None:
    """Close a connection the pattern cannot use, and say why."""
    events.closing = True
    await nc.close()
    raise BrokerError(reason)


def _explain(error: str) -> str:
    """The connection error, with what to do about the TLS ones."""
    if "CERTIFICATE_VERIFY_FAILED" in error:
        return f"{error}: the server's certificate is not trusted; set [broker] tls_ca_file"
    return error
