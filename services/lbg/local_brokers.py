"""Brokers this project starts by itself, behind one call: the demo, benches and tests share it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from lbg.embedded import EmbeddedNats
from lbg.local_rabbitmq import LocalRabbitMQ

LOCAL_BROKERS = ("nats", "rabbitmq")


@dataclass(frozen=True)
class BrokerEndpoint:
    """Where the daemons (url) and the admin tools (url plus management API) reach a broker."""

    kind: str
    url: str
    admin_url: str | None = None

    def admin_args(self) -> list[str]:
        """cg-admin / lbg flags for the management API, where the broker has one."""
        return ["--admin-url", self.admin_url] if self.admin_url else []


@contextlib.contextmanager
def local_broker(kind: str, data_dir: Path) -> Iterator[BrokerEndpoint]:
    """Start a private broker of `kind` on free ports under `data_dir`; stop it on exit."""
    if kind == "nats":
        nats = EmbeddedNats(data_dir / "nats")
        url = nats.start()
        try:
            yield BrokerEndpoint("nats", url)
        finally:
            nats.stop()
    elif kind == "rabbitmq":
        rabbit = LocalRabbitMQ(data_dir / "rabbitmq")
        try:
            url = rabbit.start()
            yield BrokerEndpoint("rabbitmq", url, rabbit.admin_url)
        finally:
            rabbit.stop()
    else:
        raise ValueError(f"no local broker '{kind}': choose one of {', '.join(LOCAL_BROKERS)}")
