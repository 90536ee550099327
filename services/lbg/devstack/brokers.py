"""Brokers this project starts by itself, behind one call: the demo, benches and tests share it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from lbg.devstack.embedded import EmbeddedNats
from lbg.devstack.postgres import LocalPostgres
from lbg.devstack.rabbitmq import TEST_STATISTICS_MS, LocalRabbitMQ

LOCAL_BROKERS = ("nats", "rabbitmq", "messagedb")


@dataclass(frozen=True)
class BrokerEndpoint:
    """Where the daemons (url) and the admin tools (url plus management API) reach a broker."""

    kind: str
    url: str
    admin_url: str | None = None
    restart: Callable[[], object] | None = field(default=None, compare=False, repr=False)
    """Stop and start the broker on the same ports, keeping its data (brokers we started)."""
    config_file: Path | None = None
    """A TOML file with the [broker] keys needed beyond the URL (Solace: VPN, users, SEMP)."""

    def admin_args(self) -> list[str]:
        """cg-admin / lbg flags for the management API and the config file, where needed."""
        admin = ["--admin-url", self.admin_url] if self.admin_url else []
        return admin + self.config_args()

    def config_args(self) -> list[str]:
        """Every daemon's flag for the config file, where the broker needs one."""
        return ["--config", str(self.config_file)] if self.config_file else []


@contextlib.contextmanager
def local_broker(
    kind: str, data_dir: Path, rabbitmq_statistics_ms: int = TEST_STATISTICS_MS
) -> Iterator[BrokerEndpoint]:
    """Start a private broker of `kind` on free ports under `data_dir`; stop it on exit. A
    RabbitMQ node collects its management figures every `rabbitmq_statistics_ms`."""
    if kind == "nats":
        nats = EmbeddedNats(data_dir / "nats")
        url = nats.start()
        try:
            yield BrokerEndpoint("nats", url, restart=nats.restart)
        finally:
            nats.stop()
    elif kind == "rabbitmq":
        rabbit = LocalRabbitMQ(data_dir / "rabbitmq", rabbitmq_statistics_ms)
        try:
            url = rabbit.start()
            yield BrokerEndpoint("rabbitmq", url, rabbit.admin_url, restart=rabbit.restart)
        finally:
            rabbit.stop()
    elif kind == "messagedb":
        postgres = LocalPostgres(data_dir / "postgres")
        try:
            url = postgres.start()
            yield BrokerEndpoint("messagedb", url, restart=postgres.restart)
        finally:
            postgres.stop()
    else:
        raise ValueError(f"no local broker '{kind}': choose one of {', '.join(LOCAL_BROKERS)}")
