"""What every daemon's command line shares: one-line errors, logging, uvloop, stop signals."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib.util
import io
import logging
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
import orjson
import uvloop

from lbg.broker.base import BrokerError, GroupNotFound
from lbg.cli.localstate import DEFAULT_FOLDER, running_state
from lbg.handlers import HandlerLoadError
from lbg.logs import TEXT_FORMAT, formatter
from lbg.metrics import package_version
from lbg.model.group import GroupConfigError
from lbg.model.hashing import HashKeyError
from lbg.settings import LOG_FORMATS, ConfigError, LoggingSettings, load_config

T = TypeVar("T")

EXIT_FAILURE = 1
EXIT_USAGE = 2
BAD_INPUT = (ConfigError, GroupConfigError, HashKeyError)
EXPECTED_ERRORS = (
    ConfigError,
    BrokerError,
    GroupConfigError,
    HandlerLoadError,
    HashKeyError,
    OSError,
    ValueError,
)

CONTEXT = {"help_option_names": ["-h", "--help"], "show_default": True}


def version_option(prog: str) -> Callable[[T], T]:
    """`--version`: the command's name and the installed package version (looked up only
    when asked: the lookup and its imports cost every start a hundredth of a second)."""

    def show(context: click.Context, _parameter: click.Parameter, asked: bool) -> None:
        if asked and not context.resilient_parsing:
            click.echo(f"{prog} {package_version()}")
            context.exit()

    return click.option(
        "-V",
        "--version",
        is_flag=True,
        expose_value=False,
        is_eager=True,
        callback=show,
        help="Show the version and exit.",
    )


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="LBG_CONFIG",
    show_envvar=True,
    help="TOML config file (see config/); flags override its keys.",
)
broker_option = click.option(
    "--broker-url",
    envvar="LBG_BROKER_URL",
    show_envvar=True,
    help="Broker URL, e.g. rabbitmq://host:5672 [default: the local stack in ./var/local if "
    "one runs, else the config's broker.url, else nats://127.0.0.1:4222].",
)
metrics_port_option = click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    help="Serve Prometheus metrics on this port (0: off) [config: metrics.port].",
)
connect_retry_option = click.option(
    "--connect-retry",
    "connect_retry_for",
    type=click.FloatRange(min=0),
    help="Seconds to keep retrying at start-up while the broker or the group is not there "
    "(0: fail at once) [config: broker.connect_retry_for].",
)
admin_url_option = click.option(
    "--admin-url",
    help="Management API: RabbitMQ's http://host:15672 or Solace's SEMP http://host:8080.",
)
group_option = click.option(
    "--group",
    "group_name",
    envvar="LBG_GROUP",
    show_envvar=True,
    help="Group name (its config is read from the broker) [default: the local stack's group, "
    "else the config's group.name, else orders].",
)
verbose_option = click.option(
    "-v", "--verbose", count=True, help="More log detail (-vv for debug)."
)
log_format_option = click.option(
    "--log-format",
    "logging_format",
    type=click.Choice(LOG_FORMATS),
    envvar="LBG_LOG_FORMAT",
    show_envvar=True,
    help="Log lines as text or as JSON objects, one per line [config: logging.format].",
)
quiet_option = click.option("-q", "--quiet", is_flag=True, help="Only warnings and errors.")
workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False),
    help="Where daemon logs and broker data go [default: a new temporary folder].",
)


@dataclasses.dataclass(frozen=True)
class DaemonFlags:
    """The flags every daemon shares: its config file, broker, group, metrics and logging."""

    config_path: str | None
    broker_url: str | None
    connect_retry_for: float | None
    group_name: str | None
    metrics_port: int | None
    logging_format: str | None
    verbose: int
    quiet: bool

    def load(self, schema: type[T], overrides: Mapping[str, Any]) -> T:
        """The daemon's settings (its config file, these flags and its own `overrides` over
        it), with logging set up first for the load's errors, then as the settings say."""
        setup_logging(self.verbose, self.quiet)
        shared = {
            "broker.url": self.broker_url,
            "broker.connect_retry_for": self.connect_retry_for,
            "metrics.port": self.metrics_port,
            "logging.format": self.logging_format,
            "group.name": self.group_name,
        }
        settings = load(self.config_path, schema, {**shared, **overrides})
        setup_logging(self.verbose, self.quiet, settings.logging)
        return settings


# The shared daemon options shown before a daemon's own ones, and after them.
_LEADING = (config_option, broker_option, connect_retry_option, group_option)
_TRAILING = (metrics_port_option, log_format_option, verbose_option, quiet_option)


def daemon_options(command: Callable[..., None]) -> Callable[..., None]:
    """Add the options every daemon shares around its own and hand them to it as one
    `flags` argument (DaemonFlags); goes right below the command's `@click.command`."""

    @functools.wraps(command)
    def with_flags(**kwargs: Any) -> None:
        shared = {f.name: kwargs.pop(f.name) for f in dataclasses.fields(DaemonFlags)}
        command(DaemonFlags(**shared), **kwargs)

    # click shows a function's options in the reverse order they were added to it.
    own = getattr(command, "__click_params__", [])
    with_flags.__click_params__ = []  # type: ignore[attr-defined]
    for option in reversed(_TRAILING):
        option(with_flags)
    with_flags.__click_params__ += own  # type: ignore[attr-defined]
    for option in reversed(_LEADING):
        option(with_flags)
    return with_flags


# The optional extras, by the top-level module that each brings.
EXTRAS = {
    "pyarrow": "replay",
    "pyspark": "replay",
    "numpy": "replay",
    "pandas": "replay",
    "locust": "loadtest",
    "matplotlib": "loadtest",
}


@contextlib.contextmanager
def needs_extra() -> Iterator[None]:
    """Imports in this block that need an optional extra fail with one line naming the extra
    to install, not a traceback (the bare install is the daemons only)."""
    try:
        yield
    except ModuleNotFoundError as exc:
        root = (exc.name or "").partition(".")[0]
        if root not in EXTRAS:
            raise
        extra = EXTRAS[root]
        fail(f"needs {root}, from the [{extra}] extra: pip install 'sticky-lbg[{extra}]'")


def require_extra(*modules: str) -> None:
    """Fail in one line naming the extra if a module of one is not installed, without
    importing it (Locust's gevent patches every socket of the process that imports it)."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            extra = EXTRAS[module]
            fail(f"needs {module}, from the [{extra}] extra: pip install 'sticky-lbg[{extra}]'")


def settings_defaults(schema: type) -> Callable[[click.Command], click.Command]:
    """Show, in each option's help, the default its settings key takes when neither the flag
    nor the config gives it (the flags default to None so a config file's value wins); a
    group's subcommands too, so apply it to a group after they are all added."""

    def decorate(command: click.Command) -> click.Command:
        defaults = _flattened_defaults(schema)
        for sub in getattr(command, "commands", {}).values():
            decorate(sub)
        for param in command.params:
            if not isinstance(param, click.Option) or param.to_info_dict()["default"] is not None:
                continue
            value = next((defaults[k] for k in _candidate_keys(param.name) if k in defaults), None)
            if value in (None, "") or "[default:" in (param.help or ""):
                continue
            if param.is_flag and param.secondary_opts:
                value = param.opts[0] if value else param.secondary_opts[0]
            param.help = f"{param.help or ''} [default: {_shown_default(value)}]".strip()
        return command

    return decorate


def _flattened_defaults(schema: type) -> dict[str, Any]:
    """Every leaf default of a settings schema by its flag-style name (`broker_url`, `rate`)."""
    found: dict[str, Any] = {}
    for section in dataclasses.fields(schema):
        for field in dataclasses.fields(section.default_factory()):  # type: ignore[misc]
            found.setdefault(f"{section.name}_{field.name}", field.default)
            found.setdefault(field.name, field.default)
    return found


def _candidate_keys(name: str | None) -> tuple[str, ...]:
    """The names under which a parameter may find its settings default (as flag_names())."""
    if name is None:
        return ()
    return (name, name.removesuffix("_path"), name.removesuffix("_mb"))


def _shown_default(value: Any) -> str:
    """A default as the TOML would spell it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def setup_logging(
    verbose: int = 0, quiet: bool = False, config: LoggingSettings | None = None
) -> None:
    """One-line logs on stderr (stdout stays free for reports): text or JSON as `[logging]`
    says; -v/-vv/-q override its level. Called again once the config is read."""
    config = config or LoggingSettings()
    level = (
        logging.WARNING
        if quiet
        else logging.DEBUG
        if verbose > 1
        else logging.INFO
        if verbose
        else getattr(logging, config.level.upper())
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(config.format))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    shards = logging.INFO if verbose or level == logging.DEBUG else logging.WARNING
    logging.getLogger("lbg.validator.shards").setLevel(shards)
    if verbose < 2:
        for noisy in NOISY_LIBRARIES:
            logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
        # The adapters log every lost connection and retry themselves, in one line each.
        logging.getLogger("aiormq.connection").setLevel(logging.CRITICAL)
        handler.addFilter(_library_tracebacks_dropped)


NOISY_LIBRARIES = ("nats", "httpx", "aio_pika", "aiormq")


def _library_tracebacks_dropped(record: logging.LogRecord) -> bool:
    """Keep a client library's log line but drop its traceback: a lost connection is an
    expected event that the adapters report and recover from, not a crash."""
    if record.name.split(".", 1)[0] in NOISY_LIBRARIES:
        record.exc_info = None
        record.exc_text = None
    return True


def run_folder(workdir: str | None, name: str) -> Path:
    """The folder of a long local run (demo, soak): `workdir` or a new temporary one, with the
    run's own log in `<name>.log` there."""
    folder = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix=f"lbg-{name}-"))
    folder.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        filename=folder / f"{name}.log",
        level=logging.INFO,
        format=TEXT_FORMAT,
    )
    return folder


def print_verdict(text: str, folder: Path, document: dict | None, ok: bool) -> NoReturn:
    """End a long local run: its report, where the logs are, then (if asked) the report as
    one JSON object on the last line; exit 1 unless `ok`."""
    click.echo("")
    click.echo(text)
    click.echo(f"logs: {folder}")
    if document is not None:
        click.echo(orjson.dumps(document).decode())
    sys.exit(0 if ok else 1)


def fail(message: str, code: int = EXIT_FAILURE) -> NoReturn:
    """Print one line naming the problem and exit: never a traceback for expected errors."""
    prog = os.path.basename(sys.argv[0]) or "lbg"
    click.echo(f"{prog}: error: {message}", err=True)
    sys.exit(code)


def load(path: str | None, schema: type[T], overrides: dict[str, Any]) -> T:
    """Load a daemon's config, failing with one line on any problem; without --config and
    --broker-url, a local stack running from here (`lbg local up`) provides the broker (and
    the group, without --group); errors name the flags the user gave."""
    try:
        return load_config(path, schema, with_local_stack(path, overrides), flag_names(overrides))
    except ConfigError as exc:
        fail(str(exc), EXIT_USAGE)


def flag_names(overrides: dict[str, Any]) -> dict[str, str]:
    """The flag (or argument) of the running command that gives each dotted override key:
    `group.queue_count` -> `--queue-count`, `client.id` -> `--id`, `group.name` -> `GROUP`."""
    params: dict[str, click.Parameter] = {}
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        for param in ctx.command.params:
            if param.name is not None:
                params.setdefault(param.name, param)
        ctx = ctx.parent
    names = {}
    for dotted in overrides:
        section, _, leaf = dotted.rpartition(".")
        for candidate in (leaf, f"{section}_{leaf}", f"{leaf}_path", section):
            param = params.get(candidate)
            if param is not None:
                names[dotted] = _shown_param(param)
                break
    return names


def _shown_param(param: click.Parameter) -> str:
    """How a user wrote a parameter: its long flag (`--queue-count`) or its METAVAR."""
    if isinstance(param, click.Option):
        return max(param.opts, key=len)
    return param.human_readable_name


def with_local_stack(path: str | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """`overrides` with the broker of the local stack in ./var/local when the command takes
    --broker-url and neither it nor a config file names a broker (else unchanged); its group
    too, where the command takes --group and none was given."""
    if path is not None or "broker.url" not in overrides or overrides["broker.url"] is not None:
        return overrides
    state = running_state(Path(DEFAULT_FOLDER).absolute())
    if state is None:
        return overrides
    log = logging.getLogger("lbg")
    log.info("using the local stack's broker %s (%s)", state.broker_url, DEFAULT_FOLDER)
    found = {"broker.url": state.broker_url}
    if state.admin_url and overrides.get("broker.admin_url") is None:
        found["broker.admin_url"] = state.admin_url
    if "group.name" in overrides and overrides["group.name"] is None:
        found["group.name"] = state.group
    return overrides | found


@contextlib.asynccontextmanager
async def naming_the_broker(url: str) -> AsyncIterator[None]:
    """Prefix a missing group's error with the broker that was asked (`nats://...: group
    'x' does not exist`), so a user who reached the wrong broker sees which one."""
    try:
        yield
    except GroupNotFound as exc:
        raise GroupNotFound(f"{url}: {exc}") from None


@contextlib.contextmanager
def one_line_errors() -> Iterator[None]:
    """Turn any error escaping a command into one line on stderr (traceback only with -vv);
    bad input (config, group definition, key) exits 2 like a bad flag, anything else 1."""
    try:
        yield
    except BAD_INPUT as exc:
        fail(str(exc), EXIT_USAGE)
    except EXPECTED_ERRORS as exc:
        fail(str(exc) or type(exc).__name__)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        logging.getLogger("lbg").debug("unexpected error", exc_info=True)
        fail(f"unexpected {type(exc).__name__}: {exc} (run with -vv for details)")


def _log_task_stacks() -> None:
    """On SIGUSR1: log what every task of the daemon is waiting for (a hang, diagnosed live)."""
    stacks = io.StringIO()
    for task in asyncio.all_tasks():
        task.print_stack(limit=8, file=stacks)
    logging.getLogger("lbg").warning("SIGUSR1: stacks of every task\n%s", stacks.getvalue())


def run(main: Callable[[asyncio.Event], Awaitable[int]]) -> NoReturn:
    """Run an async main on uvloop; SIGTERM/SIGINT set its stop event (SIGUSR1 logs every
    task's stack); exit with its code."""

    async def wrapper() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        loop.add_signal_handler(signal.SIGUSR1, _log_task_stacks)
        return await main(stop)

    with one_line_errors():
        code = uvloop.run(wrapper())
    sys.exit(code)


def run_with_broker(settings: Any, action: Callable[[Any], Awaitable[int]]) -> None:
    """Connect to `settings.broker`, run `action(broker)` (an operator command), disconnect."""
    from lbg.api import default_id
    from lbg.broker import connect_broker

    async def main(_stop: asyncio.Event) -> int:
        broker = await connect_broker(settings.broker, default_id("lbg"))
        try:
            async with naming_the_broker(settings.broker.shown_url):
                return await action(broker)
        finally:
            await broker.close()

    run(main)
