"""lbg-client: a group member bound to every queue, active where the broker says."""

from __future__ import annotations

import asyncio

import click

from lbg.api import Client
from lbg.cli.common import (
    CONTEXT,
    DaemonFlags,
    daemon_options,
    one_line_errors,
    run,
    settings_defaults,
    version_option,
)
from lbg.handlers import load_handler
from lbg.metrics import HANDLER_SECONDS, HANDOVER_SECONDS
from lbg.metrics import serve as serve_metrics
from lbg.settings import ClientConfig


@settings_defaults(ClientConfig)
@click.command(context_settings=CONTEXT)
@version_option("lbg-client")
@daemon_options
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
def main(
    flags: DaemonFlags,
    client_id: str | None,
    index: int | None,
    count: int | None,
    stall_timeout: float | None,
    cycle_seconds: float | None,
    handler: str | None,
    retries: int | None,
    window: int | None,
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
    overrides = {
        "client.id": client_id,
        "client.index": index,
        "client.count": count,
        "client.stall_timeout": stall_timeout,
        "client.cycle_seconds": cycle_seconds,
        "client.handler": handler,
        "client.retries": retries,
        "client.window": window,
    }
    settings = flags.load(ClientConfig, overrides)
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
