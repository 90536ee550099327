"""hashed-publisher: publish keyed events to a group, numbered per key, counted only when acked."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys

import click
import orjson

from lbg.api import default_id
from lbg.cli.common import (
    CONTEXT,
    EXIT_USAGE,
    DaemonFlags,
    daemon_options,
    fail,
    run,
    settings_defaults,
    version_option,
)
from lbg.metrics import PUBLISH_SECONDS
from lbg.metrics import serve as serve_metrics
from lbg.publisher import HashedPublisher, cycle_keys, generated_keys, read_file, read_lines
from lbg.retry import join_group
from lbg.settings import PublisherConfig

log = logging.getLogger("lbg.publisher")


@settings_defaults(PublisherConfig)
@click.command(context_settings=CONTEXT)
@version_option("hashed-publisher")
@daemon_options
@click.option("--id", "publisher_id", help="Publisher identity in summaries [default: host-pid].")
@click.option(
    "--input",
    "input_path",
    help='JSON-lines events {"key": ..., "data": ...}; "-" for stdin; omit to generate keys.',
)
@click.option("--keys", type=int, help="Number of generated keys (UUID/UUID, as the original).")
@click.option("--rate", type=float, help="Events per second; 0 = as fast as acks allow.")
@click.option("--count", type=int, help="Stop after this many events (0 = no limit).")
@click.option("--duration", type=float, help="Stop after this many seconds (0 = no limit).")
@click.option("--window", type=int, help="Most unacked publishes at once (one per key).")
@click.option(
    "--summary/--no-summary", default=None, help="Publish the per-key summary at the end."
)
@click.option("--json", "as_json", is_flag=True, help="Print the final stats as one JSON line.")
def main(
    flags: DaemonFlags,
    publisher_id: str | None,
    input_path: str | None,
    keys: int | None,
    rate: float | None,
    count: int | None,
    duration: float | None,
    window: int | None,
    summary: bool | None,
    as_json: bool,
) -> None:
    """Publish each event to <HP>/<bucket>/<key>, bucket = hash(key) mod HC, seq per key.

    Nothing counts as sent until the broker acknowledged it. At the end a summary (the last
    sequence of every key) goes to the group's summary destination for the validator.
    """
    overrides = {
        "publisher.id": publisher_id,
        "publisher.input": input_path,
        "publisher.keys": keys,
        "publisher.rate": rate,
        "publisher.count": count,
        "publisher.duration": duration,
        "publisher.window": window,
        "publisher.summary": summary,
    }
    settings = flags.load(PublisherConfig, overrides)
    p = settings.publisher
    name = p.id or default_id("pub")
    if p.input and p.input != "-":
        _check_readable(
            p.input, "--input" if input_path else f"{flags.config_path}: [publisher] input"
        )

    async def publish(stop: asyncio.Event) -> int:
        joined = await join_group(settings.broker, settings.group.name, name, stop)
        if joined is None:
            return 0
        broker, config = joined
        async with contextlib.AsyncExitStack() as stack:
            stack.push_async_callback(broker.close)
            publisher = HashedPublisher(
                broker, settings.group.name, config, name, window=p.window, rate=p.rate
            )
            await stack.enter_async_context(
                serve_metrics(
                    settings.metrics.port,
                    settings.metrics.address,
                    publisher.metric_families,
                    broker.connected,
                    (PUBLISH_SECONDS,),
                )
            )
            if p.input == "-":
                events = read_lines(sys.stdin.buffer, "<stdin>", publisher.stats)
            elif p.input:
                events = read_file(p.input, publisher.stats)
            else:
                events = cycle_keys(generated_keys(p.keys))
            log.info("publisher %s -> group '%s' (%s)", name, settings.group.name, config.to_json())
            stats = await publisher.run(events, count=p.count, duration=p.duration, stop=stop)
            if p.summary:
                await publisher.publish_summary()
            done = f"published {stats.acked} events in {stats.elapsed:.1f}s ({stats.rate:.0f}/s)"
            if stats.rejected_input:
                log.warning(
                    "%s; skipped %d bad input lines (each logged above): exit 1",
                    done,
                    stats.rejected_input,
                )
            else:
                log.info("%s", done)
            if as_json:
                sys.stdout.write(orjson.dumps(stats.to_dict()).decode() + "\n")
            return 0 if stats.rejected_input == 0 else 1

    run(publish)


def _check_readable(path: str, where: str) -> None:
    """Fail at once, before connecting, naming `where` (the flag or key), if `path` cannot be
    read: a typo in --input should not wait for the broker."""
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        fail(f"{where}: cannot read {path!r} ({(exc.strerror or str(exc)).lower()})", EXIT_USAGE)
