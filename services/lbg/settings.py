"""TOML configuration for every daemon: frozen dataclass sections, checked types and ranges.

Any problem becomes a `ConfigError` whose message is one line naming the file, key and value.
"""

import dataclasses
import json
import math
import operator
import os
import re
import types
import typing
from collections.abc import Mapping
from datetime import date, time
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    import tomli as tomllib

from lbg.broker.adapters import SCHEMES, adapter_for, heartbeat_timing
from lbg.model.group import GROUP_NAME, GROUP_NAME_RULE, HASH_PREFIX, HASH_PREFIX_RULE
from lbg.model.hashing import HASH_FUNCTIONS
from lbg.model.timing import HeartbeatTiming

T = TypeVar("T")

PASSWORD_ENV = "LBG_BROKER_PASSWORD"
ADMIN_PASSWORD_ENV = "LBG_ADMIN_PASSWORD"

_NAME = re.compile(r"[A-Za-z0-9_-]+")
_TLS_KEYS = ("tls_ca_file", "tls_cert_file", "tls_key_file")
_USERINFO_PASSWORD = re.compile(r"([a-z]+://[^/@:,]*:)[^/@,]*@", re.I)
_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)([^/@]*)@", re.I)
_HANDLER = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
_TOML_POSITION = re.compile(r"^(.*?) \(at (?:line (\d+), column \d+|end of document)\)$", re.S)
_LIMITS = {"ge": (">=", operator.ge), "gt": (">", operator.gt), "le": ("<=", operator.le)}
_TYPE_NAMES = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}


class ConfigError(Exception):
    """A configuration problem, described in one line that names its file, key and value."""


def _read_secret(key: str, path: str) -> str:
    """A secret kept in a file (first and only content, stripped); ConfigError if unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        raise ConfigError(f"[broker] {key}: cannot read {_show(path)} ({reason})") from None


def mask_password(url: str) -> str:
    """`url` (or a comma-separated list of them) with every password in it replaced by ***."""
    return _USERINFO_PASSWORD.sub(r"\1***@", url)


def split_userinfo(url: str) -> tuple[str, str | None, str | None]:
    """`url` without its `user:password@` part, and that user and password (unquoted)."""
    match = _USERINFO.match(url)
    if match is None:
        return url, None, None
    user, colon, password = match.group(2).partition(":")
    return (
        match.group(1) + url[match.end() :],
        unquote(user) or None,
        unquote(password) if colon else None,
    )


def _bounded(
    default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None
) -> Any:
    """A dataclass field with an inclusive/exclusive numeric range checked by the loader."""
    limits = {
        name: value for name, value in (("ge", ge), ("gt", gt), ("le", le)) if value is not None
    }
    return dataclasses.field(default=default, metadata=limits)


def _show(value: Any) -> str:
    """Render a config value for an error message, always on one short line."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = _quote(value)
    elif isinstance(value, dict):
        text = "a table"
    elif isinstance(value, list):
        text = "an array"
    elif isinstance(value, date | time):
        text = value.isoformat()
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _quote(text: str) -> str:
    """Double-quote text, escaping quotes, backslashes and anything unprintable."""
    escape = (c if c.isprintable() and c not in '"\\' else json.dumps(c)[1:-1] for c in text)
    return '"' + "".join(escape) + '"'


def _key(name: str) -> str:
    """Render a key as TOML would, quoting it unless it is a bare key."""
    return name if _NAME.fullmatch(name) else _quote(name)


def _check_name(what: str, value: str, pattern: re.Pattern[str], hint: str) -> None:
    """Raise ValueError unless `value` matches `pattern` (names end up in subjects and streams)."""
    if not pattern.fullmatch(value):
        raise ValueError(f"{what}: expected {hint}, got {_show(value)}")


@dataclasses.dataclass(frozen=True)
class BrokerSettings:
    """How to reach the broker; the password can also come from a file or the environment."""

    url: str = "nats://127.0.0.1:4222"
    user: str | None = None
    password: str | None = dataclasses.field(default=None, repr=False)
    password_file: str | None = None
    token: str | None = dataclasses.field(default=None, repr=False)
    connect_timeout: float = _bounded(5.0, gt=0)
    connect_retry_for: float = _bounded(60.0, ge=0)
    admin_url: str | None = None
    admin_user: str | None = None
    admin_password: str | None = dataclasses.field(default=None, repr=False)
    admin_password_file: str | None = None
    vpn: str = "default"
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    def validate(self) -> None:
        """Reject URLs whose scheme no supported broker speaks, that name no host, and TLS
        files that do not exist (so a typo fails at start-up, naming the key)."""
        scheme, _, rest = self.url.partition("://")
        adapter = adapter_for(scheme)
        if adapter is None or not rest or rest.startswith("/"):
            schemes = ", ".join(SCHEMES)
            raise ValueError(
                f"url: expected <scheme>://<host> with scheme {schemes};"
                f" got {_show(self.shown_url)}"
            )
        if self.admin_url is not None and not re.fullmatch(r"https?://[^/]+.*", self.admin_url):
            raise ValueError(
                "admin_url: expected http(s)://<host>[:port];"
                f" got {_show(mask_password(self.admin_url))}"
            )
        for key in _TLS_KEYS:
            path = getattr(self, key)
            if path is not None and not os.path.isfile(path):
                raise ValueError(f"{key}: no such file {_show(path)}")
        if self.tls_key_file is not None and self.tls_cert_file is None:
            raise ValueError("tls_key_file: needs tls_cert_file (the client certificate) too")
        plain = adapter.tls_instead.get(scheme.lower())
        tls_key = next((k for k in _TLS_KEYS if getattr(self, k) is not None), None)
        if plain and tls_key:
            raise ValueError(f"{tls_key}: a {scheme}:// URL never uses TLS; use {plain}://")

    @property
    def shown_url(self) -> str:
        """The URL with any password in it masked, for log lines and error messages."""
        return mask_password(self.url)

    def secret(self) -> str | None:
        """The password: `password`, else `password_file`'s content, else $LBG_BROKER_PASSWORD."""
        if self.password is not None:
            return self.password
        if self.password_file is not None:
            return _read_secret("password_file", self.password_file)
        return os.environ.get(PASSWORD_ENV) or None

    def login(self) -> tuple[str | None, str | None]:
        """User and password: the `user` key with secret(), else the URL's user with the URL's
        password, or with secret() when the URL names the user only (so the password can stay
        out of the command line, in a file or the environment)."""
        if self.user:
            return self.user, self.secret()
        try:
            userinfo = urlsplit(self.url.split(",")[0])
            user, password = userinfo.username, userinfo.password
        except ValueError:
            return None, None
        if not user:
            return None, None
        return unquote(user), unquote(password) if password is not None else self.secret()

    def admin_login(self) -> tuple[str | None, str | None, str | None]:
        """admin_url without credentials (they go in a header, never into a message), and
        the management user and password: the admin_* keys, else those in admin_url."""
        if self.admin_url is None:
            return None, self.admin_user, self.admin_secret()
        url, user, password = split_userinfo(self.admin_url)
        return url, self.admin_user or user, self.admin_secret() or password

    def admin_secret(self) -> str | None:
        """The management password: `admin_password`, its file, else $LBG_ADMIN_PASSWORD."""
        if self.admin_password is not None:
            return self.admin_password
        if self.admin_password_file is not None:
            return _read_secret("admin_password_file", self.admin_password_file)
        return os.environ.get(ADMIN_PASSWORD_ENV) or None


@dataclasses.dataclass(frozen=True)
class GroupSettings:
    """A load-balancing group as cg-admin creates it: hash buckets spread over exclusive queues."""

    name: str = "orders"
    hash_prefix: str = "orders"
    hash_count: int = _bounded(64, ge=1)
    queue_count: int = _bounded(4, ge=1)
    queue_size_mb: int = _bounded(100, ge=1)
    client_username: str = "lbg-client"
    hash_function: str = "java"
    exclusive: bool = True
    priority_timeout: float = _bounded(2.0, gt=0)
    replicas: int = _bounded(1, ge=1, le=5)
    category: str = ""  # Message DB only: an existing category the group reads ("": none)

    def validate(self) -> None:
        """Names must be usable in subjects; every queue needs at least one bucket."""
        _check_name("name", self.name, GROUP_NAME, GROUP_NAME_RULE)
        _check_name("hash_prefix", self.hash_prefix, HASH_PREFIX, HASH_PREFIX_RULE)
        if not self.client_username:
            raise ValueError("client_username: must not be empty")
        if self.hash_function not in HASH_FUNCTIONS:
            choices = ", ".join(HASH_FUNCTIONS)
            shown = _show(self.hash_function)
            raise ValueError(f"hash_function: expected one of {choices}, got {shown}")
        if self.queue_count > self.hash_count:
            raise ValueError(
                f"queue_count: must be <= hash_count ({self.hash_count}), got {self.queue_count}"
            )


@dataclasses.dataclass(frozen=True)
class GroupRef:
    """Names a group whose definition the daemon reads from the broker's store."""

    name: str = "orders"

    def validate(self) -> None:
        """The name must be usable in stream and bucket names."""
        _check_name("name", self.name, GROUP_NAME, GROUP_NAME_RULE)


@dataclasses.dataclass(frozen=True)
class PublisherSettings:
    """What hashed-publisher sends, how fast, and for how long (0 means unlimited)."""

    id: str = ""
    input: str = ""
    keys: int = _bounded(100, ge=1)
    rate: float = _bounded(0.0, ge=0)
    count: int = _bounded(0, ge=0)
    duration: float = _bounded(0.0, ge=0)
    window: int = _bounded(1000, ge=1)
    summary: bool = True


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    """One lbg-client: dynamic membership or a static slot (index of count), and its handler."""

    id: str = ""
    index: int | None = _bounded(None, ge=0)
    count: int | None = _bounded(None, ge=1)
    cycle_seconds: float = _bounded(30.0, gt=0)
    handler: str = "lbg.handlers:republish"
    retries: int = _bounded(3, ge=0)
    retry_backoff: float = _bounded(0.2, ge=0)
    window: int = _bounded(256, ge=1)
    # Dynamic mode's heartbeat timing; None: the broker adapter's (heartbeat_timing).
    heartbeat_interval: float | None = _bounded(None, gt=0)
    lease: float | None = _bounded(None, gt=0)
    lease_margin: float | None = _bounded(None, gt=0)
    stall_timeout: float = _bounded(30.0, gt=0)
    park_after_stalls: int = _bounded(2, ge=1)

    def timing(self, broker_url: str) -> HeartbeatTiming:
        """The heartbeat timing on the broker at `broker_url`: the values given here, that
        broker's defaults for the others (a ValueError naming the key if they do not fit)."""
        return heartbeat_timing(broker_url).given(
            self.heartbeat_interval, self.lease, self.lease_margin
        )

    def validate(self) -> None:
        """Static mode needs index and count together, with index < count; handler is mod:func.
        (The heartbeat timing is checked with the broker: ClientConfig, Client.)"""
        if (self.index is None) != (self.count is None):
            given, missing = ("index", "count") if self.count is None else ("count", "index")
            raise ValueError(f"{given}: static mode needs {missing} too")
        if self.index is not None and self.count is not None and self.index >= self.count:
            raise ValueError(f"index: must be < count ({self.count}), got {self.index}")
        _check_name("handler", self.handler, _HANDLER, "module:function")


@dataclasses.dataclass(frozen=True)
class ValidatorSettings:
    """validation-client's report, strictness and when it stops on its own."""

    report_json: str = ""
    strict: bool = False
    progress_interval: float = _bounded(5.0, ge=0)
    idle_exit: float = _bounded(0.0, ge=0)
    web_port: int = _bounded(0, ge=0, le=65535)
    web_address: str = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class MetricsSettings:
    """Where a daemon serves Prometheus metrics (`/metrics`); port 0 turns it off."""

    port: int = _bounded(0, ge=0, le=65535)
    address: str = "127.0.0.1"


LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_FORMATS = ("text", "json")


@dataclasses.dataclass(frozen=True)
class LoggingSettings:
    """How a daemon logs on stderr: its level and text lines or JSON objects (log pipelines)."""

    level: str = "info"
    format: str = "text"

    def validate(self) -> None:
        """Only the levels and formats the daemons know, so a typo fails at start-up."""
        for key, value, choices in (
            ("level", self.level, LOG_LEVELS),
            ("format", self.format, LOG_FORMATS),
        ):
            if value not in choices:
                raise ValueError(f"{key}: expected one of {', '.join(choices)}, got {_show(value)}")


@dataclasses.dataclass(frozen=True)
class AdminConfig:
    """config/cg-admin.toml."""

    broker: BrokerSettings = dataclasses.field(default_factory=BrokerSettings)
    group: GroupSettings = dataclasses.field(default_factory=GroupSettings)
    logging: LoggingSettings = dataclasses.field(default_factory=LoggingSettings)


@dataclasses.dataclass(frozen=True)
class PublisherConfig:
    """config/hashed-publisher.toml."""

    broker: BrokerSettings = dataclasses.field(default_factory=BrokerSettings)
    group: GroupRef = dataclasses.field(default_factory=GroupRef)
    publisher: PublisherSettings = dataclasses.field(default_factory=PublisherSettings)
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    logging: LoggingSettings = dataclasses.field(default_factory=LoggingSettings)


@dataclasses.dataclass(frozen=True)
class ClientConfig:
    """config/lbg-client.toml."""

    broker: BrokerSettings = dataclasses.field(default_factory=BrokerSettings)
    group: GroupRef = dataclasses.field(default_factory=GroupRef)
    client: ClientSettings = dataclasses.field(default_factory=ClientSettings)
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    logging: LoggingSettings = dataclasses.field(default_factory=LoggingSettings)

    def validate(self) -> None:
        """The client's heartbeat timing fits together with its broker's defaults."""
        client_timing(self.client, self.broker)


def client_timing(client: ClientSettings, broker: BrokerSettings) -> HeartbeatTiming:
    """`client.timing` on `broker`, its error naming the key as `client.<key>`."""
    try:
        return client.timing(broker.url)
    except ValueError as exc:
        raise ValueError(f"client.{exc}") from None


@dataclasses.dataclass(frozen=True)
class ValidatorConfig:
    """config/validation-client.toml."""

    broker: BrokerSettings = dataclasses.field(default_factory=BrokerSettings)
    group: GroupRef = dataclasses.field(default_factory=GroupRef)
    validator: ValidatorSettings = dataclasses.field(default_factory=ValidatorSettings)
    metrics: MetricsSettings = dataclasses.field(default_factory=MetricsSettings)
    logging: LoggingSettings = dataclasses.field(default_factory=LoggingSettings)


def load_config(
    path: str | os.PathLike[str] | None,
    schema: type[T],
    overrides: Mapping[str, Any] | None = None,
    names: Mapping[str, str] | None = None,
) -> T:
    """Read `path` (None: defaults only), apply dotted `overrides` (None values skipped), check.

    `names` maps an override's dotted key to what the user wrote (a flag such as
    `--queue-count`), so that an error about it names that instead of the config key."""
    source = None if path is None else os.fspath(path)
    data = {} if source is None else _read_toml(source)
    applied = _apply_overrides(data, overrides or {})
    return _Builder(source, applied, names or {}).build(schema, data, ())


def _read_toml(source: str) -> dict[str, Any]:
    """Parse a TOML file, turning I/O and syntax problems into one-line ConfigErrors."""
    try:
        with open(source, "rb") as handle:
            text = handle.read().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({(exc.strerror or str(exc)).lower()})") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    try:
        return tomllib.loads(text)
    except ValueError as exc:
        match = _TOML_POSITION.match(str(exc))
        reason, line = (match.group(1), match.group(2)) if match else (str(exc), None)
        where = f"line {line}: " if line else ""
        raise ConfigError(f"{source}: {where}invalid TOML ({' '.join(reason.split())})") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid TOML (nested too deeply)") from None


def _apply_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> set[tuple[str, ...]]:
    """Write each given override into `data`; return the key paths that were overridden."""
    applied = set()
    for dotted, value in overrides.items():
        if value is None:
            continue
        *parents, leaf = parts = tuple(dotted.split("."))
        node = data
        for depth, part in enumerate(parents):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                table = ".".join(parents[: depth + 1])
                raise ConfigError(f"override {dotted}: {table} is {_show(node)}, not a table")
        node[leaf] = value
        applied.add(parts)
    return applied


class _Builder:
    """Turns parsed TOML into (nested) dataclasses, naming the origin of any bad value."""

    def __init__(
        self, source: str | None, overridden: set[tuple[str, ...]], names: Mapping[str, str]
    ) -> None:
        self.source = source
        self.overridden = overridden
        self.names = {path: names[".".join(path)] for path in overridden if ".".join(path) in names}

    def origin(self, overridden: bool) -> str:
        """Who supplied a section's values: the file, the defaults, overrides, or a mix."""
        if self.source is None:
            return "overrides" if overridden else "defaults"
        return f"{self.source} + overrides" if overridden else self.source

    def error(self, path: tuple[str, ...], message: str) -> ConfigError:
        """An error about the key at `path`, attributed to an override or to the file."""
        if path in self.names:
            return ConfigError(f"{self.names[path]}: {message}")
        if path in self.overridden:
            return ConfigError(f"override {'.'.join(path)}: {message}")
        *section, key = path
        where = f"[{'.'.join(map(_key, section))}] {_key(key)}" if section else f"[{_key(key)}]"
        return ConfigError(f"{self.origin(False)}: {where}: {message}")

    def build(self, cls: type[T], data: dict[str, Any], path: tuple[str, ...]) -> T:
        """Check every key of `data` against dataclass `cls` and construct it."""
        hints = typing.get_type_hints(cls)
        fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        values = {}
        for name, raw in data.items():
            if name not in fields:
                kind = "section" if isinstance(raw, dict) else "key"
                known = ", ".join(sorted(fields))
                raise self.error((*path, name), f"unknown {kind} (known: {known})")
            values[name] = self.convert(fields[name], hints[name], raw, (*path, name))
        for name, hint in hints.items():
            if name not in values and dataclasses.is_dataclass(hint):
                values[name] = self.build(hint, {}, (*path, name))
        instance = cls(**values)
        validate = getattr(instance, "validate", None)
        if validate is not None:
            try:
                validate()
            except ValueError as exc:
                raise self.invalid(path, str(exc)) from None
        return instance

    def invalid(self, path: tuple[str, ...], message: str) -> ConfigError:
        """A section's check failed with "<key>: <why>": name the flag if one gave that key
        (and any other flag named in the why), else the file or defaults and the section."""
        key, _, why = message.partition(":")
        *section, key = key.split(".")  # a whole config's check names `<section>.<key>`
        path = (*path, *section)
        for flagged, name in self.names.items():
            if flagged[:-1] == path:
                why = re.sub(rf"\b{flagged[-1]}\b", name, why)
        if (*path, key) in self.names:
            return ConfigError(f"{self.names[(*path, key)]}:{why}")
        touched = any(p[: len(path)] == path for p in self.overridden)
        return ConfigError(f"{self.origin(touched)}: [{'.'.join(map(_key, path))}] {key}:{why}")

    def convert(
        self, field: dataclasses.Field[Any], hint: Any, raw: Any, path: tuple[str, ...]
    ) -> Any:
        """Check one value against its field's type and range; recurse into sections."""
        if dataclasses.is_dataclass(hint):
            if not isinstance(raw, dict):
                raise self.error(path, f"expected a table, got {_show(raw)}")
            return self.build(hint, raw, path)
        optional = isinstance(hint, types.UnionType)
        kind = next(k for k in typing.get_args(hint) if k is not type(None)) if optional else hint
        value = _coerce(raw, kind)
        if value is None or not _within(value, field.metadata):
            raise self.error(path, f"expected {_expected(kind, field.metadata)}, got {_show(raw)}")
        return value


def _coerce(raw: Any, kind: type) -> Any:
    """`raw` as `kind` (a bool is not a number; an int is a float), or None if it is not one."""
    if isinstance(raw, bool) != (kind is bool):
        return None
    if kind is float and isinstance(raw, int | float):
        try:
            value = float(raw)
        except OverflowError:
            return None
        return value if math.isfinite(value) else None
    return raw if isinstance(raw, kind) else None


def _within(value: Any, limits: Mapping[str, Any]) -> bool:
    """Whether a value respects its field's ge/gt/le limits."""
    return all(check(value, limits[name]) for name, (_, check) in _LIMITS.items() if name in limits)


def _expected(kind: type, limits: Mapping[str, Any]) -> str:
    """Describe what a field accepts, e.g. "an integer >= 1"."""
    bounds = [f"{symbol} {limits[name]}" for name, (symbol, _) in _LIMITS.items() if name in limits]
    return " ".join([_TYPE_NAMES[kind], " and ".join(bounds)]).strip()
