"""`lbg spark-cluster up|status|down`: a standalone Spark cluster on loopback to replay against."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import click

from lbg.cli.common import fail, needs_extra
from lbg.devstack.spark_cluster import (
    SparkClusterError,
    executors,
    master_status,
    read_state,
    start_cluster,
    stop_cluster,
)

DEFAULT_FOLDER = "var/spark"


@contextlib.contextmanager
def _one_line() -> Iterator[None]:
    """A cluster that cannot start or be found is one line, not a traceback."""
    try:
        yield
    except SparkClusterError as exc:
        fail(str(exc))


folder_option = click.option(
    "--folder",
    type=click.Path(file_okay=False),
    default=DEFAULT_FOLDER,
    show_default=True,
    help="Where the cluster keeps its state, logs and work folders.",
)


@click.group(name="spark-cluster")
def spark_cluster() -> None:
    """A Spark master and workers on this machine, from the pyspark package (Java 17)."""


@spark_cluster.command()
@folder_option
@click.option("--workers", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--cores", type=click.IntRange(min=1), default=1, show_default=True,
              help="Cores per worker.")  # fmt: skip
@click.option("--memory", default="1g", show_default=True, help="Memory per worker.")
def up(folder: str, workers: int, cores: int, memory: str) -> None:
    """Start the cluster in the background and print its master URL."""
    with _one_line(), needs_extra():
        if (Path(folder) / "cluster.json").exists():
            fail(f"a Spark cluster already runs from {folder} (stop it with `down`)")
        state = start_cluster(Path(folder), workers, cores, memory)
    click.echo(f"Spark master {state.master_url} (web UI {state.web_url}), {workers} workers")
    click.echo(f'replay: make replay ARGS="--master {state.master_url}"; logs in {folder}')


@spark_cluster.command()
@folder_option
def status(folder: str) -> None:
    """The master's state, its alive workers and running executors."""
    with _one_line():
        state = read_state(Path(folder))
        try:
            seen = master_status(state.web_url)
        except OSError as exc:
            fail(f"Spark master {state.web_url} does not answer: {exc}")
    click.echo(f"Spark master {state.master_url}: {seen.get('status')}, "
               f"{seen.get('aliveworkers')} workers, {len(executors(state))} executors, "
               f"{len(seen.get('activeapps') or [])} running apps")  # fmt: skip


@spark_cluster.command()
@folder_option
def down(folder: str) -> None:
    """Stop the workers, their executors and the master."""
    with _one_line():
        state = read_state(Path(folder))
        stop_cluster(state)
    click.echo(f"Spark cluster {state.master_url} stopped")
