"""lbg-client: a group member bound to every queue, active where the broker says."""

from __future__ import annotations

import asyncio

import click

from lbg.api import Client
from lbg.cli.common import (
    CONTEXT,
    broker_option,
    config_option,
    connect_retry_option,
    group_option,
    load,
    log_format_option,
    metrics_port_option,
    one_line_errors,
    quiet_option,
    run,
    settings_defaults,
    setup_logging,
    verbose_option,
    version_option,
)
from lbg.handlers import load_handler
from lbg.metrics import HANDLER_SECONDS, HANDOVER_SECONDS
from lbg.metrics import serve as serve_metrics
from lbg.settings import ClientConfig


@settings_defaults(ClientConfig)
@click.command(context_settings=CONTEXT)
@version_option("lbg-client")
@config_option
@broker_option
@connect_retry_option
@group_option
@click.option("--id", "client_id", help="Client identity in logs and reports [default: host-pid].")
@click.option(
    "--client-index", "index", type=int, help="Static mode: this client's index (0-based)."
)
@click.option("--client-count", "count", type=int, help="Static mode: how many clients there are.")
@click.option(
    "--stall-timeout", type=float, help="Dynamic mode: seconds a handler may hang before giving up."
)
@click.option(
    "--cycle-seconds", type=float, help="Static mode: release secondary queues this often."
)
@click.option("--handler", help="module:function called for each event (sync or async).")
@click.option("--retries", type=int, help="Handler retries before a message is dead-lettered.")
@click.option("--window", type=int, help="Events in flight per queue (keys concurrent, in order).")
@metrics_port_option
@log_format_option
@verbose_option
@quiet_option
def main(
    config_path: str | None,
    broker_url: str | None,
    connect_retry_for: float | None,
    group_name: str | None,
    client_id: str | None,
    index: int | None,
    count: int | None,
    stall_timeout: float | None,
    cycle_seconds: float | None,
    handler: str | None,
    retries: int | None,
    window: int | None,
    metrics_port: int | None,
    logging_format: str | None,
    verbose: int,
    quiet: bool,
) -> None:
    """Bind every queue of the group; the broker makes one bound client per queue active.

    Dynamic mode (the default: no index or count): the client joins the group by itself;
    members heartbeat over the broker and share the queues evenly; a join, a leave, a crash
    or a stalled member moves only the queues that must move.

    Static mode (the original design, with --client-index and --client-count): queue q is
    primary for the client with index q mod count; secondary queues are released every
    --cycle-seconds so primaries reclaim them.

    Each event is acked only after the handler succeeded; after --retries failures it goes
    to the group's dead-letter destination with the reason. SIGTERM hands over cleanly.
    """
    setup_logging(verbose, quiet)
    overrides = {
        "broker.url": broker_url,
        "broker.connect_retry_for": connect_retry_for,
        "metrics.port": metrics_port,
        "logging.format": logging_format,
        "group.name": group_name,
        "client.id": client_id,
        "client.index": index,
        "client.count": count,
        "client.stall_timeout": stall_timeout,
        "client.cycle_seconds": cycle_seconds,
        "client.handler": handler,
        "client.retries": retries,
        "client.window": window,
    }
    settings = load(config_path, ClientConfig, overrides)
    setup_logging(verbose, quiet, settings.logging)
    with one_line_errors():
        handler_function, hooks = load_handler(settings.client.handler)
        client = Client(
            settings.broker,
            settings.group.name,
            handler_function,
            client_id=settings.client.id or None,
            options=settings.client,
            hooks=hooks,
        )

    async def serve(stop: asyncio.Event) -> int:
        async with serve_metrics(
            settings.metrics.port,
            settings.metrics.address,
            client.metric_families,
            client.ready,
            (HANDLER_SECONDS, HANDOVER_SECONDS),
        ):
            await client.run(stop)
        return 0

    run(serve)
