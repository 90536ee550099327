"""lbg.settings: example files, defaults, overrides, one-line errors, secrets, fuzzing."""

import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.broker.adapters import RABBITMQ_TIMING
from lbg.model.group import GroupConfigError, validate_group_name
from lbg.model.timing import DEFAULT_TIMING, HeartbeatTiming
from lbg.settings import (
    PASSWORD_ENV,
    AdminConfig,
    BrokerSettings,
    ClientConfig,
    ConfigError,
    PublisherConfig,
    ValidatorConfig,
    load_config,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "config"
EXAMPLES = {
    "cg-admin.toml": AdminConfig,
    "hashed-publisher.toml": PublisherConfig,
    "lbg-client.toml": ClientConfig,
    "validation-client.toml": ValidatorConfig,
}
SCHEMAS = list(EXAMPLES.values())


def write(tmp_path: Path, text: str, name: str = "x.toml") -> Path:
    """Write a config file and return its path."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def error_of(path: Path | None, schema: type, overrides: dict[str, Any] | None = None) -> str:
    """The message of the ConfigError that loading must raise, checked to be one line."""
    with pytest.raises(ConfigError) as caught:
        load_config(path, schema, overrides)
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    return message


@pytest.mark.parametrize(("name", "schema"), EXAMPLES.items())
def test_example_files_load_and_match_defaults(name: str, schema: type) -> None:
    assert load_config(CONFIG_DIR / name, schema) == load_config(None, schema)


def test_the_idle_economy_profile_halves_the_heartbeats_within_the_lease_rules() -> None:
    config = load_config(CONFIG_DIR / "lbg-client-idle-economy.toml", ClientConfig)
    timing = config.client.timing(config.broker.url)
    assert (timing.interval, timing.lease, timing.margin) == (
        2 * DEFAULT_TIMING.interval,
        2 * DEFAULT_TIMING.lease,
        2 * DEFAULT_TIMING.margin,
    )


def test_a_client_takes_its_brokers_heartbeat_timing_unless_its_config_sets_it(
    tmp_path: Path,
) -> None:
    on_rabbitmq = write(tmp_path, '[broker]\nurl = "amqp://h:5672"\n')
    config = load_config(on_rabbitmq, ClientConfig)
    assert config.client.timing(config.broker.url) == RABBITMQ_TIMING
    config = load_config(on_rabbitmq, ClientConfig, {"client.heartbeat_interval": 0.3})
    assert config.client.timing(config.broker.url) == HeartbeatTiming(0.3, 1.5, 0.3)


def test_a_heartbeat_timing_that_breaks_the_lease_rules_names_the_key(tmp_path: Path) -> None:
    path = write(tmp_path, "[client]\nheartbeat_interval = 0.3\n")
    message = error_of(path, ClientConfig)
    assert message == (
        f"{path}: [client] lease: must be >= 3 x heartbeat_interval (0.9), got 0.7"
    ), "NATS's default lease is too short for that interval"
    path = write(tmp_path, '[broker]\nurl = "amqp://h"\n[client]\nheartbeat_interval = 0.3\n')
    assert load_config(path, ClientConfig).client.timing("amqp://h").lease == 1.5


def test_example_admin_file_describes_the_orders_group() -> None:
    config = load_config(CONFIG_DIR / "cg-admin.toml", AdminConfig)
    assert config.broker.url == "nats://127.0.0.1:4222"
    group = config.group
    assert (group.name, group.hash_prefix, group.hash_count, group.queue_count) == (
        "orders",
        "orders",
        64,
        4,
    )


@pytest.mark.parametrize(("name", "schema"), EXAMPLES.items())
def test_every_key_is_documented_with_its_default(name: str, schema: type) -> None:
    text = (CONFIG_DIR / name).read_text(encoding="utf-8")
    for section in dataclasses.fields(schema):
        for field in dataclasses.fields(section.type):
            assert field.name in text, f"{name}: {section.name}.{field.name} undocumented"


def test_defaults() -> None:
    config = load_config(None, ClientConfig)
    assert config.broker == BrokerSettings()
    assert config.broker.url == "nats://127.0.0.1:4222"
    assert config.group.name == "orders"
    assert config.client.index is None and config.client.count is None
    assert config.client.handler == "lbg.handlers:republish"
    assert load_config(None, AdminConfig).group.priority_timeout == 2.0
    publisher = load_config(None, PublisherConfig).publisher
    assert (publisher.keys, publisher.window, publisher.summary) == (100, 1000, True)


def test_missing_sections_and_keys_take_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[client]\nretries = 7\n"), ClientConfig)
    assert config.client.retries == 7
    assert config.client.cycle_seconds == 30.0
    assert config.broker == BrokerSettings()


def test_int_is_accepted_for_float_but_bool_is_not_an_int(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[client]\ncycle_seconds = 3\n"), ClientConfig)
    assert config.client.cycle_seconds == 3.0
    assert isinstance(config.client.cycle_seconds, float)
    message = error_of(write(tmp_path, "[client]\nretries = true\n"), ClientConfig)
    assert message.endswith("[client] retries: expected an integer >= 0, got true")


@pytest.mark.parametrize("value", ["inf", "-inf", str(10**400)])
def test_numbers_must_be_finite_floats(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, f"[publisher]\nrate = {value}\n")
    message = error_of(path, PublisherConfig)
    assert message.startswith(f"{path}: [publisher] rate: expected a number >= 0, got ")


def test_overrides_win_over_the_file_and_none_means_not_given(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nurl = "nats://a:1"\n[client]\nindex = 0\ncount = 2\n')
    overrides = {"client.index": 1, "broker.url": "nats://b:2", "client.count": None}
    config = load_config(path, ClientConfig, overrides)
    assert (config.client.index, config.client.count) == (1, 2)
    assert config.broker.url == "nats://b:2"


def test_overrides_apply_without_a_file() -> None:
    config = load_config(None, ClientConfig, {"client.index": 0, "client.count": 3})
    assert (config.client.index, config.client.count) == (0, 3)


def test_bad_type_names_file_section_key_and_value(tmp_path: Path) -> None:
    path = write(tmp_path, '[client]\ncount = "four"\n', "lbg-client.toml")
    assert error_of(path, ClientConfig) == (
        f'{path}: [client] count: expected an integer >= 1, got "four"'
    )


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("connect_timeout = 0", "[broker] connect_timeout: expected a number > 0, got 0"),
        ("connect_timeout = nan", "[broker] connect_timeout: expected a number > 0, got nan"),
        ('url = "ftp://host"', "[broker] url: expected <scheme>://<host>"),
        ('url = "nats://"', "[broker] url: expected <scheme>://<host>"),
        ("user = 3", "[broker] user: expected a string, got 3"),
    ],
)
def test_broker_values_are_checked(tmp_path: Path, line: str, expected: str) -> None:
    path = write(tmp_path, f"[broker]\n{line}\n")
    message = error_of(path, ClientConfig)
    assert message.startswith(f"{path}: ")
    assert expected in message


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("cycle_seconds = 0.0", "[client] cycle_seconds: expected a number > 0, got 0.0"),
        ("index = 3\ncount = 2", "[client] index: must be < count (2), got 3"),
        ("index = 1", "[client] index: static mode needs count too"),
        ("count = 1", "[client] count: static mode needs index too"),
        ('handler = "republish"', '[client] handler: expected module:function, got "republish"'),
    ],
)
def test_client_values_are_checked(tmp_path: Path, lines: str, expected: str) -> None:
    path = write(tmp_path, f"[client]\n{lines}\n")
    assert expected in error_of(path, ClientConfig)


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ("queue_count = 65", "[group] queue_count: must be <= hash_count (64), got 65"),
        ('name = "a.b"', "[group] name: expected 1-64 characters"),
        ('hash_prefix = "a.b"', "[group] hash_prefix: expected 1-40 characters"),
        ("hash_count = 0", "[group] hash_count: expected an integer >= 1, got 0"),
    ],
)
def test_group_values_are_checked(tmp_path: Path, lines: str, expected: str) -> None:
    assert expected in error_of(write(tmp_path, f"[group]\n{lines}\n"), AdminConfig)


def test_group_reference_name_is_checked(tmp_path: Path) -> None:
    message = error_of(write(tmp_path, '[group]\nname = ""\n'), ValidatorConfig)
    assert "[group] name: expected 1-64 characters" in message


def test_invalid_toml_names_file_and_line(tmp_path: Path) -> None:
    path = write(tmp_path, "[client]\nretries = 3\ncount\n")
    message = error_of(path, ClientConfig)
    assert message.startswith(f"{path}: line 3: invalid TOML (")
    assert "Expected '=' after a key" in message


def test_deeply_nested_toml_is_a_config_error(tmp_path: Path) -> None:
    path = write(tmp_path, "x = " + "[" * 100_000)
    assert error_of(path, ClientConfig) == f"{path}: invalid TOML (nested too deeply)"


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "x.toml"
    path.write_bytes(b'[client]\nid = "\xff"\n')
    assert error_of(path, ClientConfig).startswith(f"{path}: not UTF-8 text")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    assert error_of(path, ClientConfig) == f"{path}: no such file"


def test_directory_instead_of_file(tmp_path: Path) -> None:
    assert error_of(tmp_path, ClientConfig).startswith(f"{tmp_path}: cannot read (")


def test_unknown_key_lists_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "[client]\ncolour = 1\n")
    message = error_of(path, ClientConfig)
    assert message.startswith(f"{path}: [client] colour: unknown key (known: count, cycle_seconds")


def test_unknown_section(tmp_path: Path) -> None:
    path = write(tmp_path, "[clients]\nindex = 1\n")
    assert error_of(path, ClientConfig) == (
        f"{path}: [clients]: unknown section (known: broker, client, group, logging, metrics)"
    )


def test_a_section_must_be_a_table(tmp_path: Path) -> None:
    path = write(tmp_path, "client = 3\n")
    assert error_of(path, ClientConfig) == f"{path}: [client]: expected a table, got 3"


def test_section_of_another_daemon_is_unknown(tmp_path: Path) -> None:
    path = write(tmp_path, "[client]\nretries = 1\n")
    assert "[client]: unknown section" in error_of(path, PublisherConfig)


@pytest.mark.parametrize("escape", ["\\n", "\\u2028", "\\u0085", '\\"'])
def test_odd_keys_and_values_are_quoted_on_one_line(tmp_path: Path, escape: str) -> None:
    path = write(tmp_path, f'[client]\n"a{escape}b" = 1\n')
    assert f'[client] "a{escape}b": unknown key' in error_of(path, ClientConfig)
    path = write(tmp_path, f'[client]\nretries = "a{escape}b"\n')
    assert f'got "a{escape}b"' in error_of(path, ClientConfig)


def test_override_errors_name_the_override(tmp_path: Path) -> None:
    path = write(tmp_path, "[client]\ncount = 2\n")
    assert error_of(path, ClientConfig, {"client.count": "four"}) == (
        'override client.count: expected an integer >= 1, got "four"'
    )
    assert error_of(path, ClientConfig, {"client.colour": 1}).startswith(
        "override client.colour: unknown key (known: "
    )


def test_cross_field_error_mentions_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, "[client]\ncount = 2\n")
    assert error_of(path, ClientConfig, {"client.index": 3}) == (
        f"{path} + overrides: [client] index: must be < count (2), got 3"
    )


def test_override_below_a_scalar(tmp_path: Path) -> None:
    path = write(tmp_path, "[client]\ncount = 2\n")
    assert error_of(path, ClientConfig, {"client.count.x": 1}) == (
        "override client.count.x: client.count is 2, not a table"
    )


def test_secret_prefers_password_then_file_then_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LBG_BROKER_PASSWORD", "from-env")
    secret_file = write(tmp_path, "  from-file\n", "secret")
    assert BrokerSettings().secret() == "from-env"
    assert BrokerSettings(password_file=str(secret_file)).secret() == "from-file"
    both = BrokerSettings(password="direct", password_file=str(secret_file))
    assert both.secret() == "direct"
    monkeypatch.delenv("LBG_BROKER_PASSWORD")
    assert BrokerSettings().secret() is None


def test_unreadable_password_file_is_a_config_error(tmp_path: Path) -> None:
    broker = BrokerSettings(password_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"^\[broker\] password_file: cannot read "):
        broker.secret()


def test_repr_hides_secrets(tmp_path: Path) -> None:
    path = write(tmp_path, '[broker]\nuser = "u"\npassword = "hunter2"\ntoken = "t0k3n"\n')
    config = load_config(path, ClientConfig)
    assert config.broker.secret() == "hunter2"
    for text in (repr(config), str(config), repr(config.broker)):
        assert "hunter2" not in text and "t0k3n" not in text
        assert "'u'" in text


def test_sections_are_frozen() -> None:
    config = load_config(None, ClientConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.client.index = 1  # type: ignore[misc]


def expect_config_or_error(path: Path, schema: type, overrides: dict[str, Any]) -> None:
    """Loading either succeeds or raises a one-line ConfigError naming the file or override."""
    try:
        loaded = load_config(path, schema, overrides)
    except ConfigError as exc:
        message = str(exc)
        assert len(message.splitlines()) == 1
        assert message.startswith((str(path), "override "))
    else:
        assert isinstance(loaded, schema)


def toml_string(text: str) -> str:
    """A TOML basic string holding `text`."""
    escaped = "".join(
        "\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c
        for c in text
    )
    return f'"{escaped}"'


def toml_value(value: Any) -> str:
    """A TOML inline rendering of a scalar, array or table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(document: dict[str, dict[str, Any]]) -> str:
    """A TOML file with one [section] table per entry of `document`."""
    lines = []
    for section, table in document.items():
        lines.append(f"[{toml_string(section)}]")
        lines.extend(f"{toml_string(k)} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


KNOWN_NAMES = sorted(
    {f.name for schema in SCHEMAS for f in dataclasses.fields(schema)}
    | {
        f.name
        for schema in SCHEMAS
        for s in dataclasses.fields(schema)
        for f in dataclasses.fields(s.type)
    }
)
NAMES = st.sampled_from(KNOWN_NAMES) | st.text(st.characters(codec="utf-8"), max_size=8)
SCALARS = (
    st.booleans() | st.integers() | st.floats() | st.text(st.characters(codec="utf-8"), max_size=20)
)
VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(NAMES, children, max_size=3),
    max_leaves=8,
)
DOCUMENTS = st.dictionaries(NAMES, st.dictionaries(NAMES, VALUES, max_size=6), max_size=4)
OVERRIDES = st.dictionaries(
    st.sampled_from(
        ["client.index", "client.count", "broker.url", "group.name", "publisher.rate", "x", "a.b.c"]
    ),
    st.none() | SCALARS,
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(schema=st.sampled_from(SCHEMAS), document=DOCUMENTS, overrides=OVERRIDES)
def test_any_toml_document_loads_or_gives_a_config_error(
    schema: type, document: dict[str, dict[str, Any]], overrides: dict[str, Any]
) -> None:
    text = toml_document(document)
    with tempfile.TemporaryDirectory() as directory:
        path = write(Path(directory), text)
        expect_config_or_error(path, schema, overrides)


@settings(max_examples=300, deadline=None)
@given(
    schema=st.sampled_from(SCHEMAS),
    data=st.binary(max_size=200) | st.text(st.characters(codec="utf-8")).map(str.encode),
)
def test_any_bytes_load_or_give_a_config_error(schema: type, data: bytes) -> None:
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "x.toml"
        path.write_bytes(data)
        expect_config_or_error(path, schema, {})


def test_generated_documents_are_valid_toml() -> None:
    """Guards the fuzzers above: the tiny writer must produce TOML the loader accepts."""
    document = {"client": {"id": 'a"\\\x7f\x00é', "retry_backoff": 1e-05, "count": 2, "index": 0}}
    with tempfile.TemporaryDirectory() as directory:
        config = load_config(write(Path(directory), toml_document(document)), ClientConfig)
    assert config.client.id == 'a"\\\x7f\x00é'
    assert config.client.retry_backoff == 1e-05


@pytest.mark.parametrize(
    ("url", "user", "expected"),
    [
        ("amqp://pub@host", None, ("pub", "from-env")),
        ("amqp://pub:in-url@host", None, ("pub", "in-url")),
        ("amqp://host", "pub", ("pub", "from-env")),
        ("amqp://other:in-url@host", "pub", ("pub", "from-env")),
        ("nats://host:4222,nats://pub:x@h2", None, (None, None)),
        ("amqp://host", None, (None, None)),
    ],
)
def test_a_user_named_anywhere_takes_the_password_from_the_environment(
    url: str, user: str | None, expected: tuple, monkeypatch: pytest.MonkeyPatch
) -> None:
    """So no password need be on the command line, where `ps` shows it."""
    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    assert BrokerSettings(url=url, user=user).login() == expected


def test_credentials_in_admin_url_leave_it_and_are_masked_in_errors() -> None:
    settings = BrokerSettings(admin_url="http://adm:p%40ss@mq:15672/api")
    assert settings.admin_login() == ("http://mq:15672/api", "adm", "p@ss")
    assert BrokerSettings(admin_url="http://mq:15672", admin_user="a").admin_login()[:2] == (
        "http://mq:15672",
        "a",
    )
    with pytest.raises(ValueError) as caught:
        BrokerSettings(url="bogus://u:pw@h", admin_url="ftp://a:pw@h").validate()
    assert "pw" not in str(caught.value)
    with pytest.raises(ValueError) as caught:
        BrokerSettings(admin_url="ftp://a:pw@h").validate()
    assert str(caught.value) == 'admin_url: expected http(s)://<host>[:port]; got "ftp://a:***@h"'


def test_rabbitmq_logs_in_as_the_url_user_with_the_password_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lbg.broker.rabbitmq.adapter import amqp_url

    monkeypatch.setenv(PASSWORD_ENV, "from-env")
    url = amqp_url(BrokerSettings(url="amqp://cu@mq:5672/%2F"))
    assert (url.user, url.password, url.host) == ("cu", "from-env", "mq")


@pytest.mark.parametrize("name", ["-orders", "_orders", "o" * 65])
def test_a_group_name_the_broker_would_refuse_is_refused_when_the_config_is_read(
    tmp_path: Path, name: str
) -> None:
    """The daemons' settings and cg-admin's group config apply one rule to a group name."""
    message = error_of(write(tmp_path, f'[group]\nname = "{name}"\n'), AdminConfig)
    assert "[group] name: expected 1-64 characters" in message
    with pytest.raises(GroupConfigError):
        validate_group_name(name)
