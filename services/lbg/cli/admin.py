"""cg-admin: create, list, show and delete load-balanced groups in the broker."""

from __future__ import annotations

import os
import sys
from typing import TextIO

import click
import orjson

from lbg.admin.resize import resize_group
from lbg.api import default_id
from lbg.broker import check_broker_runs, connect_broker
from lbg.broker.base import Broker, GroupExists
from lbg.cli.common import (
    CONTEXT,
    admin_url_option,
    broker_option,
    config_option,
    fail,
    load,
    log_format_option,
    naming_the_broker,
    one_line_errors,
    quiet_option,
    run,
    settings_defaults,
    setup_logging,
    version_option,
)
from lbg.model.group import CATEGORY_HASH, GroupConfig, validate_group_name
from lbg.model.hashing import HASH_FUNCTIONS
from lbg.settings import AdminConfig

CLIENT_PASSWORD_ENV = "LBG_CLIENT_PASSWORD"
PUBLISHER_PASSWORD_ENV = "LBG_PUBLISHER_PASSWORD"


force_option = click.option(
    "--force",
    is_flag=True,
    help="RabbitMQ: take over an existing user that cg-admin did not create (its other"
    " tags stay; its permissions are replaced).",
)


def _settings(ctx: click.Context, **group_overrides: object) -> AdminConfig:
    overrides = {
        "broker.url": ctx.obj["broker_url"],
        "broker.admin_url": ctx.obj["admin_url"],
        "logging.format": ctx.obj["logging_format"],
    }
    overrides |= {f"group.{key}": value for key, value in group_overrides.items()}
    settings = load(ctx.obj["config_path"], AdminConfig, overrides)
    setup_logging(quiet=ctx.obj["quiet"], config=settings.logging)
    return settings


async def _with_broker(settings: AdminConfig, action, priority_timeout: float = 2.0) -> int:
    broker: Broker = await connect_broker(settings.broker, default_id("cg-admin"), priority_timeout)
    try:
        async with naming_the_broker(settings.broker.shown_url):
            return await action(broker)
    finally:
        await broker.close()


@click.group(context_settings=CONTEXT)
@version_option("cg-admin")
@config_option
@broker_option
@admin_url_option
@log_format_option
@quiet_option
@click.pass_context
def main(
    ctx: click.Context,
    config_path: str | None,
    broker_url: str | None,
    admin_url: str | None,
    logging_format: str | None,
    quiet: bool,
) -> None:
    """Administer load-balanced groups (LBG): queues, bucket subscriptions and the stored config.

    A group has QC exclusive queues; queue q takes the hash buckets q, q+QC, q+2QC, ... below
    HC. Its config (HP, HC, QC, QS, CU, HF, RF; CA for a Message DB group over an existing
    category) is stored in the broker for every daemon to read.
    """
    setup_logging(quiet=quiet)
    ctx.obj = {
        "config_path": config_path,
        "broker_url": broker_url,
        "admin_url": admin_url,
        "logging_format": logging_format,
        "quiet": quiet,
    }


def _given_here(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    """A connection flag given after the subcommand wins over one given before it."""
    if value is not None:
        ctx.obj[param.name] = value


CONNECTION_FLAGS = (
    (("--config", "config_path"), click.Path(dir_okay=False)),
    (("--broker-url", "broker_url"), None),
    (("--admin-url", "admin_url"), None),
)


def _connection_flags_here_too(command: click.Command) -> None:
    """Accept --config, --broker-url and --admin-url after the subcommand as well (as the
    operator commands take them): `cg-admin create --broker-url X` works like
    `cg-admin --broker-url X create`."""
    for decls, kind in CONNECTION_FLAGS:
        help_text = "Also accepted here: as before the subcommand."
        command.params.append(
            click.Option(decls, type=kind, expose_value=False, callback=_given_here, help=help_text)
        )


@main.command()
@click.option("--group", "name", help="Group name [config: group.name].")
@click.option("--hash-prefix", help="HP: first topic level of the group's events.")
@click.option("--hash-count", type=int, help="HC: number of hash buckets (>= QC).")
@click.option("--queue-count", type=int, help="QC: number of exclusive queues (max clients).")
@click.option("--queue-size", "queue_size_mb", type=int, help="QS: spool per queue, MB.")
@click.option("--client-username", help="CU: the identity LBG clients use.")
@click.option(
    "--hash-function", help=f"HF: key-to-bucket hash, one of {', '.join(HASH_FUNCTIONS)}."
)
@click.option(
    "--replicas",
    type=int,
    help="RF: copies a NATS cluster keeps of each queue and of the config (1-5).",
)
@click.option(
    "--category",
    help="CA, Message DB only: read this existing category; its streams' ids are the keys "
    "(HF messagedb, the default with this flag).",
)
@click.option(
    "--competing/--exclusive",
    default=None,
    help="Competing consumers (no per-key order: the explicit opt-out) or exclusive queues.",
)
@click.option(
    "--from-json",
    "from_json",
    help='The original JSON form, e.g. \'{"HP":"hash1","HC":100,"QC":12,"QS":100,"CU":"lg_cu1"}\'.',
)
@click.option(
    "--priority-timeout",
    type=float,
    help="NATS: seconds before the broker moves a silent owner's queue (failover time).",
)
@click.option("--if-not-exists", is_flag=True, help="Succeed if the same group already exists.")
@click.option(
    "--client-password-file",
    type=click.File("r", encoding="utf-8"),
    help=f"RabbitMQ / Solace: create the CU user with this password if it does not exist "
    f"(else ${CLIENT_PASSWORD_ENV}; with neither, an existing CU only gets permissions).",
)
@force_option
@click.pass_context
def create(
    ctx: click.Context,
    name: str | None,
    competing: bool | None,
    from_json: str | None,
    priority_timeout: float | None,
    if_not_exists: bool,
    client_password_file: TextIO | None,
    force: bool,
    **fields: object,
) -> None:
    """Create a group; refuses, naming the clash, if any of its objects exists."""
    if client_password_file is not None:
        client_password: str | None = client_password_file.read().strip()
    else:
        client_password = os.environ.get(CLIENT_PASSWORD_ENV) or None
    exclusive = None if competing is None else not competing
    if fields["category"] and fields["hash_function"] is None:
        fields["hash_function"] = CATEGORY_HASH
    settings = _settings(
        ctx, name=name, exclusive=exclusive, priority_timeout=priority_timeout, **fields
    )
    g = settings.group
    with one_line_errors():
        group_name = validate_group_name(g.name)
        if from_json is not None:
            config = GroupConfig.from_json(from_json)
            if "CP" in orjson.loads(from_json):
                click.echo(
                    "cg-admin: warning: --from-json: CP (the client password) is dropped, never"
                    " stored, but it was visible in the process list: change it, and give it"
                    f" with --client-password-file or ${CLIENT_PASSWORD_ENV}",
                    err=True,
                )
        else:
            config = GroupConfig(
                hash_prefix=g.hash_prefix,
                hash_count=g.hash_count,
                queue_count=g.queue_count,
                queue_size_mb=g.queue_size_mb,
                client_username=g.client_username,
                hash_function=g.hash_function,
                exclusive=g.exclusive,
                replicas=g.replicas,
                category=g.category or None,
            )
        check_broker_runs(settings.broker.url, config)

    async def action(broker: Broker) -> int:
        try:
            await broker.create_group(group_name, config, client_password, force=force)
        except GroupExists as exc:
            existing = (await broker.list_groups()).get(group_name)
            if if_not_exists and existing == config:
                click.echo(f"group '{group_name}' already exists with the same config")
                return 0
            fail(str(exc))
        click.echo(f"created group '{group_name}': {config.to_json()}")
        for queue in range(config.queue_count):
            buckets = config.buckets_for_queue(queue)
            click.echo(f"  queue {queue}: {len(buckets)} buckets {_short(buckets)}")
        return 0

    run(lambda _stop: _with_broker(settings, action, g.priority_timeout))


def _short(buckets: list[int], limit: int = 8) -> str:
    shown = ", ".join(map(str, buckets[:limit]))
    return f"[{shown}{', ...' if len(buckets) > limit else ''}]"


@main.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="One JSON object: name -> config.")
@click.pass_context
def list_groups(ctx: click.Context, as_json: bool) -> None:
    """List every group stored in the broker."""
    settings = _settings(ctx)

    async def action(broker: Broker) -> int:
        groups = await broker.list_groups()
        if as_json:
            as_dict = {name: orjson.loads(config.to_json()) for name, config in groups.items()}
            sys.stdout.write(orjson.dumps(as_dict).decode() + "\n")
            return 0
        for name, config in groups.items():
            click.echo(f"{name}\t{config.to_json()}")
        if not groups:
            click.echo("no groups")
        return 0

    run(lambda _stop: _with_broker(settings, action))


@main.command()
@click.argument("group", required=False)
@click.pass_context
def show(ctx: click.Context, group: str | None) -> None:
    """Print a group's config and, per queue, its buckets, backlog and active client."""
    settings = _settings(ctx, name=group)
    name = settings.group.name

    async def action(broker: Broker) -> int:
        config = await broker.read_group(name)
        click.echo(f"group '{name}': {config.to_json()}")
        click.echo("queue\tbacklog\tin-flight\tactive client\tbuckets")
        for status in await broker.queue_status(name, config):
            click.echo(
                f"{status.queue}\t{status.backlog}\t{status.in_flight}\t"
                f"{status.active_client or '-'}\t{_short(status.buckets)}"
            )
        return 0

    run(lambda _stop: _with_broker(settings, action))


@main.command()
@click.argument("group")
@click.pass_context
def delete(ctx: click.Context, group: str) -> None:
    """Delete one group's queues, streams and config (and nothing else)."""
    settings = _settings(ctx, name=group)
    with one_line_errors():
        validate_group_name(group)

    async def action(broker: Broker) -> int:
        await broker.delete_group(group)
        click.echo(f"deleted group '{group}'")
        return 0

    run(lambda _stop: _with_broker(settings, action))


@main.command()
@click.argument("group")
@click.pass_context
def upgrade(ctx: click.Context, group: str) -> None:
    """Add what a group made by an older release lacks (the store of its ownership epochs,
    the client's rights on it); safe to run again. Clients refuse such a group, naming this."""
    settings = _settings(ctx, name=group)
    with one_line_errors():
        validate_group_name(group)

    async def action(broker: Broker) -> int:
        added = await broker.upgrade_group(group, await broker.read_group(group))
        click.echo(f"group '{group}': " + ("; ".join(added) if added else "nothing to add"))
        return 0

    run(lambda _stop: _with_broker(settings, action))


@main.command()
@click.argument("group")
@click.option(
    "--queues", "queue_count", type=click.IntRange(min=1), required=True, help="The new QC."
)
@click.pass_context
def resize(ctx: click.Context, group: str, queue_count: int) -> None:
    """NATS JetStream and Message DB: change a running group's QC. Events up to now are read
    under the old size, later ones under the new; the new queues start once the old ones that
    carried their buckets are drained. Running clients follow: they hear of the new size at
    once and bind or retire queues."""
    settings = _settings(ctx, name=group)
    with one_line_errors():
        validate_group_name(group)

    async def action(broker: Broker) -> int:
        done, not_told = await resize_group(broker, group, queue_count)
        click.echo(
            f"group '{group}': QC {done.before.queue_count} -> {done.after.queue_count} after "
            f"position {done.switch_position} (generation {done.after.generation}); "
            "running clients follow it"
        )
        if not_told:
            click.echo(f"note: clients not told at once ({not_told}); they read it within seconds")
        return 0

    run(lambda _stop: _with_broker(settings, action))


@main.command(name="grant-publisher")
@click.argument("group")
@click.option("--user", required=True, help="The publisher's username (not the group's CU).")
@click.option(
    "--password-file",
    type=click.File("r", encoding="utf-8"),
    help=f"Create the user with this password if it does not exist "
    f"(else ${PUBLISHER_PASSWORD_ENV}; with neither, the user must exist).",
)
@force_option
@click.pass_context
def grant_publisher(
    ctx: click.Context, group: str, user: str, password_file: TextIO | None, force: bool
) -> None:
    """RabbitMQ / Solace: let USER publish the group's events and summary and nothing else."""
    if password_file is not None:
        password: str | None = password_file.read().strip()
    else:
        password = os.environ.get(PUBLISHER_PASSWORD_ENV) or None
    settings = _settings(ctx, name=group)
    with one_line_errors():
        validate_group_name(group)

    async def action(broker: Broker) -> int:
        config = await broker.read_group(group)
        await broker.grant_publisher(group, config, user, password, force=force)
        click.echo(
            f"user '{user}' may publish to group '{group}': its events"
            f" ({config.hash_prefix}/...) and its summary"
        )
        return 0

    run(lambda _stop: _with_broker(settings, action))


@main.command(name="revoke-publisher")
@click.argument("group")
@click.option("--user", required=True, help="The publisher's username.")
@click.pass_context
def revoke_publisher(ctx: click.Context, group: str, user: str) -> None:
    """RabbitMQ / Solace: take back what grant-publisher gave USER on the group; a user it
    created goes with its last group. Revoke before deleting the group."""
    settings = _settings(ctx, name=group)
    with one_line_errors():
        validate_group_name(group)

    async def action(broker: Broker) -> int:
        config = await broker.read_group(group)
        await broker.revoke_publisher(group, config, user)
        click.echo(f"user '{user}' may no longer publish to group '{group}'")
        return 0

    run(lambda _stop: _with_broker(settings, action))


for _command in main.commands.values():
    _connection_flags_here_too(_command)


settings_defaults(AdminConfig)(main)
