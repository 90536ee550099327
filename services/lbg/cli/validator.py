"""validation-client: checks every key's sequence and reports losses, reorders and duplicates."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import click
import orjson

from lbg.api import default_id
from lbg.cli.common import (
    CONTEXT,
    DaemonFlags,
    daemon_options,
    run,
    settings_defaults,
    version_option,
)
from lbg.liveview import LiveView, serve_live_view
from lbg.metrics import serve as serve_metrics
from lbg.retry import join_group
from lbg.settings import ValidatorConfig
from lbg.validator import Validator, run_validator

log = logging.getLogger("lbg.validator")


@settings_defaults(ValidatorConfig)
@click.command(context_settings=CONTEXT)
@version_option("validation-client")
@daemon_options
@click.option("--report-json", help="Write the final report to this file as JSON.")
@click.option(
    "--strict/--no-strict", default=None, help="Exit 1 if anything was lost or reordered."
)
@click.option("--progress-interval", type=float, help="Seconds between progress lines (0 = off).")
@click.option(
    "--idle-exit",
    type=float,
    help="Exit once every published event is accounted for and nothing arrived for this long.",
)
@click.option(
    "--web-port",
    type=click.IntRange(0, 65535),
    help="Serve the live view (queue x client grid, handovers, counts) on this port.",
)
def main(
    flags: DaemonFlags,
    report_json: str | None,
    strict: bool | None,
    progress_interval: float | None,
    idle_exit: float | None,
    web_port: int | None,
) -> None:
    """Read what the LBG clients processed and check each key's sequence.

    Each record is in order, a gap, a duplicate (seen before) or a reorder (below the
    highest seen, never seen before). With the publishers' summaries it counts what was
    lost. Runs until SIGTERM/SIGINT (or --idle-exit), then prints the report.
    """
    overrides = {
        "validator.report_json": report_json,
        "validator.strict": strict,
        "validator.progress_interval": progress_interval,
        "validator.idle_exit": idle_exit,
        "validator.web_port": web_port,
    }
    settings = flags.load(ValidatorConfig, overrides)
    v = settings.validator

    async def validate(stop: asyncio.Event) -> int:
        joined = await join_group(
            settings.broker, settings.group.name, default_id("validator"), stop
        )
        if joined is None:
            return 0
        broker, _config = joined
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(broker.close)
            view = LiveView(settings.group.name)
            validator = Validator(on_queue_change=view.queue_changed, on_observation=view.observed)
            if v.web_port:
                stack.push_async_callback(
                    (await serve_live_view(view, validator, v.web_port, v.web_address)).cleanup
                )
            await stack.enter_async_context(
                serve_metrics(
                    settings.metrics.port,
                    settings.metrics.address,
                    lambda: validator.metric_families(settings.group.name),
                    broker.connected,
                )
            )
            report = await run_validator(
                broker,
                settings.group.name,
                validator,
                stop,
                progress_interval=v.progress_interval,
                idle_exit=v.idle_exit,
            )
        click.echo(report.to_text())
        if v.report_json:
            Path(v.report_json).write_bytes(
                orjson.dumps(report.to_dict(), option=orjson.OPT_INDENT_2)
            )
        return 1 if v.strict and not report.ok else 0

    run(validate)
