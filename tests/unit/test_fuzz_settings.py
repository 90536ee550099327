"""Fuzzing every daemon's TOML config beyond test_settings.py: each real section and key gets
values of every TOML type (dates and times too), plus top-level keys, sub-tables and arrays of
tables. Loading succeeds or raises a one-line ConfigError naming the file and the key."""

import dataclasses
import datetime as dt
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lbg.settings import (
    LOG_FORMATS,
    LOG_LEVELS,
    AdminConfig,
    ClientConfig,
    ConfigError,
    PublisherConfig,
    ValidatorConfig,
    load_config,
)

SCHEMAS = [AdminConfig, PublisherConfig, ClientConfig, ValidatorConfig]


def toml_string(text: str) -> str:
    """A TOML basic string holding `text`."""
    return (
        '"'
        + "".join(
            "\\" + c if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c
            for c in text
        )
        + '"'
    )


def toml_value(value: Any) -> str:
    """An inline TOML rendering of any value tomllib can produce."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return {"inf": "inf", "-inf": "-inf", "nan": "nan"}.get(repr(value), repr(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, list):
        return "[" + ", ".join(map(toml_value, value)) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


ZONES = [
    dt.UTC,
    dt.timezone(dt.timedelta(hours=5, minutes=30)),
    dt.timezone(-dt.timedelta(hours=8)),
]
# Every TOML scalar type, with the awkward corners: 64-bit limits, inf/nan, odd text.
texts = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=30)
scalars = (
    st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.sampled_from([0, -1, 1, 65535, 65536, 2**63 - 1, -(2**63)])
    | st.floats()
    | texts
    | st.sampled_from(["", "nats://", "amqp://h", "x:y", "lbg.handlers:republish", "é"])
    | st.datetimes(timezones=st.none() | st.sampled_from(ZONES)).map(
        lambda d: d.replace(microsecond=0)
    )
    | st.dates()
    | st.times().map(lambda t: t.replace(microsecond=0))
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(texts, children, max_size=2),
    max_leaves=5,
)


@st.composite
def documents(draw: st.DrawFn, schema: type) -> str:
    """A TOML file for `schema`: its own sections and keys with arbitrary values, and extras."""
    lines: list[str] = []
    for name, value in draw(
        st.dictionaries(st.sampled_from(["url", "name", "x"]), scalars, max_size=2)
    ).items():
        lines.append(f"{name} = {toml_value(value)}")
    sections = [f for f in dataclasses.fields(schema)]
    for section in draw(
        st.lists(st.sampled_from(sections), unique_by=lambda f: f.name, max_size=4)
    ):
        shape = draw(st.sampled_from(["table", "array-of-tables", "sub-table", "inline"]))
        keys = [f.name for f in dataclasses.fields(section.type)]
        table = draw(st.dictionaries(st.sampled_from(keys) | texts, values, max_size=4))
        if shape == "inline":
            lines.append(f"{section.name} = {toml_value(table)}")
            continue
        header = {
            "table": f"[{section.name}]",
            "array-of-tables": f"[[{section.name}]]",
            "sub-table": f"[{section.name}.{draw(st.sampled_from(keys))}]",
        }[shape]
        lines.append(header)
        lines.extend(f"{toml_string(k)} = {toml_value(v)}" for k, v in table.items())
    return "\n".join(lines) + "\n"


def loads_or_one_line_error(schema: type, text: str) -> None:
    """Load `text` as `schema`'s file: a config, or a one-line error naming the file."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "daemon.toml"
        path.write_text(text, encoding="utf-8")
        try:
            loaded = load_config(path, schema)
        except ConfigError as exc:
            message = str(exc)
            assert len(message.splitlines()) == 1 and "\r" not in message, message
            assert message.startswith(f"{path}: "), message
            assert len(message) < 1000, message
        else:
            assert isinstance(loaded, schema)
            assert load_config(path, schema) == loaded


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_document_with_the_real_keys_loads_or_gives_one_line(schema: type, data) -> None:
    text = data.draw(documents(schema))
    loads_or_one_line_error(schema, text)


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
@settings(max_examples=60, deadline=None)
@given(value=values, data=st.data())
def test_a_wrong_value_names_the_file_section_and_key(schema: type, value: Any, data) -> None:
    section = data.draw(st.sampled_from(dataclasses.fields(schema)))
    key = data.draw(st.sampled_from(dataclasses.fields(section.type))).name
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "daemon.toml"
        path.write_text(f"[{section.name}]\n{key} = {toml_value(value)}\n", encoding="utf-8")
        try:
            load_config(path, schema)
        except ConfigError as exc:
            message = str(exc)
            assert len(message.splitlines()) == 1, message
            assert message.startswith(f"{path}: [{section.name}]"), message
            assert key in message or "(" in message, message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[broker]\nurl = 1979-05-27T07:32:00Z\n", "[broker] url: expected a string, got 1979"),
        ("[client]\nretries = 07:32:00\n", "[client] retries: expected an integer >= 0, got 07:32"),
        ("[[client]]\nretries = 1\n", "[client]: expected a table, got an array"),
        ("[client.retries]\nx = 1\n", "[client] retries: expected an integer >= 0, got a table"),
        ("url = 'nats://h'\n", "[url]: unknown key"),
        (
            "[broker]\nconnect_retry_for = -1\n",
            "[broker] connect_retry_for: expected a number >= 0",
        ),
        ("[broker]\nconnect_retry_for = inf\n", "[broker] connect_retry_for: expected a number"),
    ],
    ids=["datetime", "time", "array-of-tables", "sub-table", "top-level", "retry-neg", "retry-inf"],
)
def test_odd_toml_shapes_are_named(text: str, expected: str, tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ClientConfig)
    assert str(caught.value).startswith(f"{path}: {expected}"), str(caught.value)


def test_connect_retry_for_accepts_zero_and_defaults_to_a_minute(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[broker]\nconnect_retry_for = 0\n", encoding="utf-8")
    assert load_config(path, ClientConfig).broker.connect_retry_for == 0.0
    assert load_config(None, ClientConfig).broker.connect_retry_for == 60.0


@pytest.mark.parametrize("schema", SCHEMAS, ids=lambda s: s.__name__)
@settings(max_examples=60, deadline=None)
@given(key=st.sampled_from(["level", "format"]), value=scalars)
def test_logging_takes_only_known_levels_and_formats(schema: type, key: str, value: Any) -> None:
    choices = {"level": LOG_LEVELS, "format": LOG_FORMATS}[key]
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "daemon.toml"
        path.write_text(f"[logging]\n{key} = {toml_value(value)}\n", encoding="utf-8")
        try:
            loaded = load_config(path, schema)
        except ConfigError as exc:
            assert value not in choices
            assert str(exc).startswith(f"{path}: [logging] {key}: expected "), str(exc)
        else:
            assert value in choices
            assert getattr(loaded.logging, key) == value


@pytest.mark.parametrize("value", [*LOG_LEVELS, *LOG_FORMATS])
def test_logging_accepts_each_choice_where_it_belongs(value: str, tmp_path: Path) -> None:
    key = "level" if value in LOG_LEVELS else "format"
    path = tmp_path / "c.toml"
    path.write_text(f'[logging]\n{key} = "{value}"\n', encoding="utf-8")
    assert getattr(load_config(path, ClientConfig).logging, key) == value
