"""`lbg parked` and `lbg unpark`: the operator's view of a group's parked keys, and their replay."""

from __future__ import annotations

import getpass
import socket
import sys

import click
import orjson

from lbg.cli.common import (
    EXIT_FAILURE,
    EXIT_USAGE,
    admin_url_option,
    broker_option,
    config_option,
    fail,
    group_option,
    load,
    run_with_broker,
    setup_logging,
    verbose_option,
)


def _connection_options(command):
    for option in reversed(
        [config_option, broker_option, admin_url_option, group_option, verbose_option]
    ):
        command = option(command)
    return command


def _settings(config_path: str | None, broker_url: str | None, admin_url, group_name):
    from lbg.admin.status import OperatorConfig

    overrides = {"broker.url": broker_url, "broker.admin_url": admin_url, "group.name": group_name}
    return load(config_path, OperatorConfig, overrides)


@click.command()
@_connection_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
def parked(
    config_path: str | None,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str | None,
    verbose: int,
    as_json: bool,
) -> None:
    """List the group's parked keys, one line each, tab-separated: key, state (parked;
    replay: its unpark is under way; suspect: its handler hung, not parked yet), parked
    events, age, the member that parked it and the first reason."""
    from lbg.admin.parking import list_parked

    setup_logging(verbose, quiet=not verbose)
    settings = _settings(config_path, broker_url, admin_url, group_name)

    async def action(broker) -> int:
        found = await list_parked(broker, settings.group.name)
        if as_json:
            sys.stdout.write(orjson.dumps([p.to_dict() for p in found]).decode() + "\n")
        elif not found:
            click.echo(f"group '{settings.group.name}': no parked keys")
        for summary in [] if as_json else found:
            click.echo(summary.to_text())
        return 0

    run_with_broker(settings, action)


@click.command()
@_connection_options
@click.option(
    "--skip-first",
    is_flag=True,
    help="Drop the first parked event (the poison) instead of replaying it; it is recorded "
    "on the group's dead-letter destination as skipped, with who and when.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    help="Seconds to wait for the replay to end; exit 1 if it did not (it goes on).",
)
@click.argument("key")
def unpark(
    config_path: str | None,
    broker_url: str | None,
    admin_url: str | None,
    group_name: str | None,
    verbose: int,
    skip_first: bool,
    timeout: float,
    key: str,
) -> None:
    """Replay the parked KEY's events in their original order through the member serving
    its queue (new events of KEY wait behind the replay), then unpark it. A key whose
    handler fails again is parked again, nothing lost (exit 1)."""
    from lbg.admin.parking import UnparkRefused, wait_unparked
    from lbg.admin.parking import unpark as request_unpark
    from lbg.model.messages import MalformedMessage, check_key

    setup_logging(verbose, quiet=not verbose)
    settings = _settings(config_path, broker_url, admin_url, group_name)
    try:
        check_key(key)
    except MalformedMessage as exc:
        fail(f"key {key!r}: {exc}", EXIT_USAGE)
    who = f"{getpass.getuser()}@{socket.gethostname()}"

    async def action(broker) -> int:
        group = settings.group.name
        try:
            await request_unpark(broker, group, key, skip_first, who)
        except UnparkRefused as exc:
            fail(str(exc), EXIT_USAGE)
        record = await wait_unparked(broker, group, key, timeout)
        if record is None:
            click.echo(f"key {key!r}: replayed and unparked")
            return 0
        if record.state == "replay":
            fail(f"key {key!r}: replay not done after {timeout:g}s (it goes on)", EXIT_FAILURE)
        fail(f"key {key!r}: failed again during its replay, parked again: {record.reason}")

    run_with_broker(settings, action)
