"""`lbg soak`: the chaos soak on a private broker (or a given one), with its verdict."""

from __future__ import annotations

import contextlib
import os
import random

import click

from lbg.cli.common import (
    EXIT_USAGE,
    EXPECTED_ERRORS,
    fail,
    print_verdict,
    run_folder,
    workdir_option,
)
from lbg.devstack.brokers import LOCAL_BROKERS


@click.command()
@click.option(
    "--broker",
    "broker_kind",
    type=click.Choice(LOCAL_BROKERS),
    default="nats",
    show_default=True,
    help="Which private broker to start and restart during the soak.",
)
@click.option(
    "--duration",
    type=click.FloatRange(min=10),
    default=600.0,
    show_default=True,
    help="Seconds of load and faults, before the drain.",
)
@click.option(
    "--rate",
    type=click.FloatRange(min=1),
    default=300.0,
    show_default=True,
    help="Events per second.",
)
@click.option(
    "--keys", type=click.IntRange(min=1), default=200, show_default=True, help="Number of keys."
)
@click.option(
    "--fault-interval",
    type=click.FloatRange(min=0.5),
    default=3.0,
    show_default=True,
    help="Mean seconds between two faults (each is drawn from 0.5x to 1.5x this).",
)
@click.option(
    "--min-clients",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Never kill or stop below this many live clients.",
)
@click.option(
    "--max-clients",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Never start more than this many clients.",
)
@click.option("--no-broker-restart", is_flag=True, help="Do not restart the broker halfway.")
@click.option(
    "--client-config",
    type=click.Path(exists=True, dir_okay=False),
    help="A TOML file every client runs with (--config), e.g. to count the false alarms of"
    " other [client] heartbeat_interval, lease and lease_margin values [default: the"
    " broker's defaults].",
)
@click.option("--seed", type=int, help="Seed of the fault sequence, to replay a run.")
@workdir_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Make the last line of stdout the final result as one JSON object.",
)
def soak(
    broker_kind: str,
    duration: float,
    rate: float,
    keys: int,
    fault_interval: float,
    min_clients: int,
    max_clients: int,
    no_broker_restart: bool,
    client_config: str | None,
    seed: int | None,
    workdir: str | None,
    as_json: bool,
) -> None:
    """Chaos soak: steady load while random clients are killed (-9), stalled (SIGSTOP for a
    few seconds) and restarted, new ones join, and the broker restarts once halfway.

    Ends with a drain and the validator's verdict; exits 1 unless nothing was lost or
    reordered, every event was accounted for and no daemon printed a traceback. Duplicates
    are counted per cause (the fault that explains them), and so are the lease's false alarms
    (live members evicted or fencing themselves with no fault to explain it).
    """
    import uvloop

    from lbg.devstack.brokers import local_broker
    from lbg.devstack.chaos import ChaosPolicy
    from lbg.devstack.embedded import BrokerStartError
    from lbg.devstack.soak import SoakOptions, run_soak
    from lbg.settings import ClientConfig, ConfigError, load_config

    try:
        policy = ChaosPolicy(min_clients, max_clients)
    except ValueError as exc:
        fail(f"--min-clients/--max-clients: {exc}")
    if client_config is not None:
        try:
            load_config(client_config, ClientConfig)
        except ConfigError as exc:
            fail(f"--client-config: {exc}", EXIT_USAGE)
    folder = run_folder(workdir, "soak")
    with contextlib.ExitStack() as stack:
        try:
            endpoint = stack.enter_context(local_broker(broker_kind, folder))
        except BrokerStartError as exc:
            fail(str(exc))
        seed = random.randrange(2**32) if seed is None else seed
        click.echo(f"private {broker_kind} broker at {endpoint.url}; seed {seed}; logs in {folder}")
        options = SoakOptions(
            endpoint=endpoint,
            duration=duration,
            rate=rate,
            keys=keys,
            fault_interval=fault_interval,
            policy=policy,
            broker_restart=not no_broker_restart,
            seed=seed,
            client_args=()
            if client_config is None
            else ("--config", os.path.abspath(client_config)),
        )
        try:
            result = uvloop.run(run_soak(options, folder / "daemons", click.echo))
        except EXPECTED_ERRORS as exc:
            fail(str(exc))
    print_verdict(result.to_text(), folder, result.to_dict() if as_json else None, result.ok)
