"""Bad input never stops the system: config errors are one line, bad messages are dead-lettered.

Config files, broker URLs, malformed events on the broker, a handler that always fails for one
key, and bad JSON-lines input to the publisher.
"""

import asyncio
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest

from lbg.broker import connect_broker
from lbg.broker.messagedb import naming
from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import LocalDeployment, script
from lbg.devstack.embedded import free_port
from lbg.model.destinations import Destination, OutputKind, event_destination
from lbg.model.group import GroupConfig
from lbg.model.messages import MAX_MESSAGE_BYTES, SEQ_HEADER, TIME_HEADER
from lbg.settings import BrokerSettings

DAEMONS = ["cg-admin", "hashed-publisher", "lbg-client", "validation-client"]


def run(program: str, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script(program), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def run_with_config(program: str, config: Path) -> subprocess.CompletedProcess[str]:
    """Start a daemon with --config; cg-admin needs a subcommand, so it lists groups."""
    extra = ["list"] if program == "cg-admin" else []
    return run(program, "--config", str(config), *extra)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


# --- (a) bad config files and unusable settings ------------------------------------------------

# A key of each daemon's own section, and a value of the wrong type for it.
OWN_KEY = {
    "cg-admin": ("group", "hash_count", '"many"'),
    "hashed-publisher": ("publisher", "rate", '"fast"'),
    "lbg-client": ("client", "retries", "[1]"),
    "validation-client": ("validator", "idle_exit", "true"),
}


@pytest.mark.parametrize("program", DAEMONS)
def test_toml_syntax_error_is_one_line_naming_file_and_line(program: str, tmp_path: Path) -> None:
    config = tmp_path / f"{program}.toml"
    config.write_text('[broker]\nurl = "nats://127.0.0.1:1\n')

    result = run_with_config(program, config)

    assert result.returncode == 2
    line = one_error_line(result)
    assert str(config) in line and "line 2" in line and "invalid TOML" in line


@pytest.mark.parametrize("program", DAEMONS)
def test_unknown_key_is_one_line_naming_file_and_key(program: str, tmp_path: Path) -> None:
    section, _key, _value = OWN_KEY[program]
    config = tmp_path / f"{program}.toml"
    config.write_text(f'[{section}]\ncolour = "blue"\n')

    result = run_with_config(program, config)

    assert result.returncode == 2
    line = one_error_line(result)
    assert str(config) in line and f"[{section}] colour" in line and "unknown key" in line


@pytest.mark.parametrize("program", DAEMONS)
def test_wrong_type_is_one_line_naming_file_and_key(program: str, tmp_path: Path) -> None:
    section, key, value = OWN_KEY[program]
    config = tmp_path / f"{program}.toml"
    config.write_text(f"[{section}]\n{key} = {value}\n")

    result = run_with_config(program, config)

    assert result.returncode == 2
    line = one_error_line(result)
    assert str(config) in line and f"[{section}] {key}" in line and "expected" in line


@pytest.mark.parametrize("program", DAEMONS)
def test_missing_config_file_is_one_line(program: str, tmp_path: Path) -> None:
    config = tmp_path / "nowhere" / "missing.toml"

    result = run_with_config(program, config)

    assert result.returncode == 2
    line = one_error_line(result)
    assert str(config) in line and "no such file" in line


def test_client_index_outside_client_count_is_one_line() -> None:
    result = run(
        "lbg-client",
        "--broker-url",
        "nats://127.0.0.1:1",
        "--client-index",
        "3",
        "--client-count",
        "2",
    )

    assert result.returncode == 2
    line = one_error_line(result)
    assert "index" in line and "3" in line and "2" in line


@pytest.mark.parametrize("spec", ["no_such_module_xyz:handle", "lbg.handlers:no_such_function"])
def test_unloadable_handler_is_one_line(spec: str) -> None:
    result = run(
        "lbg-client",
        "--broker-url",
        "nats://127.0.0.1:1",
        "--client-index",
        "0",
        "--client-count",
        "1",
        "--handler",
        spec,
    )

    assert result.returncode != 0
    assert spec in one_error_line(result)


def test_unreachable_broker_fails_within_the_connect_timeout(tmp_path: Path) -> None:
    url = f"nats://127.0.0.1:{free_port()}"
    config = tmp_path / "cg-admin.toml"
    config.write_text(f'[broker]\nurl = "{url}"\nconnect_timeout = 1\n')
    started = time.monotonic()

    try:
        result = run("cg-admin", "--config", str(config), "-q", "list", timeout=4)
    except subprocess.TimeoutExpired:
        pytest.fail(f"cg-admin list against {url} still ran after 4 s (connect_timeout = 1)")

    assert time.monotonic() - started < 4
    assert result.returncode != 0
    assert url in one_error_line(result)


# --- helpers for the broker-side tests ---------------------------------------------------------


def group_config(broker: BrokerEndpoint, group: str) -> GroupConfig:
    listing = run("cg-admin", "--broker-url", broker.url, *broker.admin_args(), "list", "--json")
    assert listing.returncode == 0, listing.stderr
    return GroupConfig.from_json(orjson.dumps(orjson.loads(listing.stdout)[group]))


async def _publish_raw(
    url: str, group: str, messages: list[tuple[Destination, bytes, dict[str, str]]]
) -> None:
    """Publish bodies and headers as they are, bypassing the publisher (through the adapter)."""
    broker = await connect_broker(BrokerSettings(url=url), "test-raw")
    try:
        await broker.read_group(group)
        for destination, body, headers in messages:
            await broker.publish(destination, body, headers)
    finally:
        await broker.close()


async def _read_dead_letters(
    url: str, group: str, want: int, timeout: float
) -> list[tuple[bytes, dict[str, str]]]:
    broker = await connect_broker(BrokerSettings(url=url), "test-dead-letters")
    found: list[tuple[bytes, dict[str, str]]] = []
    try:
        async with asyncio.timeout(timeout):
            async for message in broker.read_output(group):
                if message.kind is OutputKind.DEAD:
                    found.append((message.body, dict(message.headers)))
                    if len(found) >= want:
                        break
    except TimeoutError:
        pass
    finally:
        await broker.close()
    return found


def dead_letters(url: str, group: str, want: int) -> list[tuple[bytes, dict[str, str]]]:
    """The group's dead letters (body, headers), waiting up to 10 s for `want` of them."""
    return asyncio.run(_read_dead_letters(url, group, want, 10.0))


def queue_rows(broker: BrokerEndpoint, group: str) -> list[list[str]]:
    """`cg-admin show`'s rows: queue, backlog, in-flight, active client, buckets."""
    show = run("cg-admin", "--broker-url", broker.url, *broker.admin_args(), "show", group)
    assert show.returncode == 0, show.stderr
    return [row.split("\t") for row in show.stdout.splitlines()[2:]]


def assert_nothing_left_unacked(broker: BrokerEndpoint, group: str, within: float = 5.0) -> None:
    """Every event, good or bad, was acked: no queue has backlog or messages in flight."""
    deadline = time.monotonic() + within
    while True:
        rows = queue_rows(broker, group)
        if all(row[1] == "0" and row[2] == "0" for row in rows):
            return
        assert time.monotonic() < deadline, f"messages left unacked: {rows}"
        time.sleep(0.2)


def assert_clean_log(deployment: LocalDeployment, name: str) -> None:
    daemon = deployment.daemons[name]
    assert daemon.running, f"{name} stopped:\n{daemon.log_tail()}"
    assert "Traceback" not in daemon.log_path.read_text(), daemon.log_tail(60)


# --- impossible group parameters at `cg-admin create` -------------------------------------------

# (flags, [group] lines of a config file, what the one error line must hold). test_admin.py
# covers HC < QC, QC = 0, HC = 0 and bad hash prefixes.
IMPOSSIBLE_GROUPS = {
    "HC-above-limit": (["--hash-count", "100001"], "", ["HC (hash count)", "100001"]),
    "QS-negative": (["--queue-size", "-1"], "", ["--queue-size", "-1"]),
    "QS-zero-in-file": ([], "queue_size_mb = 0", ["[group] queue_size_mb", "got 0"]),
    "QSxQC-beyond-64-bit-bytes": (
        ["--queue-size", str(2**43)],
        "",
        ["QS (queue size MB)", str(2**43), "64 bits"],
    ),
    "HF-unknown-in-file": ([], 'hash_function = "crc32"', ["[group] hash_function", '"crc32"']),
    "HF-unknown-flag": (["--hash-function", "crc32"], "", ["--hash-function", '"crc32"']),
    "RF-above-limit": (["--replicas", "6"], "", ["replicas", "6"]),
    "HF-unknown-in-json": (
        ["--from-json", '{"HP":"PREFIX","HC":8,"QC":2,"HF":"crc32"}'],
        "",
        ["HF (hash function)", "'crc32'"],
    ),
    "QC-above-HC-in-file": ([], "hash_count = 2\nqueue_count = 3", ["queue_count", "3"]),
    "CU-with-a-space": (["--client-username", "a b"], "", ["CU (client username)", "'a b'"]),
    "name-with-a-space": (["--group", "a b"], "", ["--group", '"a b"']),
    "name-with-a-dot": (["--group", "a.b"], "", ["--group", '"a.b"']),
    "name-leading-dash": (["--group", "-a"], "", ["--group", '"-a"']),
    "name-too-long": (["--group", "n" * 65], "", ["--group", "n" * 40]),
}


@pytest.mark.parametrize("case", IMPOSSIBLE_GROUPS)
def test_impossible_group_is_one_line_naming_parameter_and_value_and_creates_nothing(
    case: str, broker: BrokerEndpoint, group_name: str, tmp_path: Path
) -> None:
    flags, lines, expected = IMPOSSIBLE_GROUPS[case]
    prefix = f"hp{group_name}"
    config = tmp_path / "cg-admin.toml"
    config.write_text(f"[group]\n{lines}\n")
    admin = ["cg-admin", "--broker-url", broker.url, *broker.admin_args()]
    flags = [flag.replace("PREFIX", prefix) for flag in flags]

    result = run(
        *admin,
        "--config",
        str(config),
        "create",
        "--group",
        group_name,
        "--hash-prefix",
        prefix,
        *flags,
    )

    assert result.returncode != 0
    line = one_error_line(result)
    assert all(part in line for part in expected), line
    listing = run(*admin, "list", "--json")
    assert listing.returncode == 0, listing.stderr
    groups = orjson.loads(listing.stdout)
    assert group_name not in groups
    assert all(config["HP"] != prefix for config in groups.values()), groups


# --- (b) malformed events are dead-lettered and nothing else stops -----------------------------


@dataclass(frozen=True)
class Malformed:
    """A message no handler can be given, and the reason its dead letter must carry."""

    key_level: str | None
    body: bytes
    headers: dict[str, str]
    reason: str


# Each kind of unusable event: our optional metadata headers with bad values, an oversized
# body, a key over the limit, and (RabbitMQ only: NATS' filter `<HP>.<b>.>` needs a level
# after the bucket) a topic with no key level at all.
MALFORMED = [
    Malformed("x", b"seq-zero", {SEQ_HEADER: "0"}, "Lbg-Seq header must be an integer >= 1"),
    Malformed("x", b"seq-word", {SEQ_HEADER: "one"}, "Lbg-Seq header must be an integer"),
    Malformed("x", b"seq-float", {SEQ_HEADER: "1.5"}, "Lbg-Seq header must be an integer"),
    Malformed("x", b"ts-word", {TIME_HEADER: "yesterday"}, "Lbg-Time header must be epoch"),
    Malformed("x", b"ts-nan", {TIME_HEADER: "nan"}, "Lbg-Time header must be epoch"),
    Malformed("k" * 201, b"long-key", {}, "key of 201 bytes exceeds 200"),
]
# NATS refuses payloads above 1 MiB (its max_payload) at publish time; RabbitMQ takes them.
RABBITMQ_ONLY = [
    Malformed("x", b"x" * (MAX_MESSAGE_BYTES + 1), {}, "bytes exceeds"),
    Malformed(None, b"no-key-level", {}, "has no key level"),
]
# Bodies that are no JSON at all, from a producer that sets no headers: valid events.
FOREIGN_BODIES = [b"not json", b"", b"\xff\xfe\xc3(", b"[1,2]", b"\x00\x01protobuf"]
GOOD_KEYS = [f"key-{i}" for i in range(8)]
ROUNDS = 40


def test_malformed_events_are_dead_lettered_with_a_reason(
    make_group,
    deployment: LocalDeployment,
    validate,
    broker: BrokerEndpoint,
    group_name: str,
    tmp_path: Path,
) -> None:
    """Bad messages on the same topics as good events, before, during and after them; bodies
    that are not JSON are no reason to dead-letter anything."""
    malformed = MALFORMED + (RABBITMQ_ONLY if broker.kind == "rabbitmq" else [])
    make_group()
    config = group_config(broker, group_name)
    deployment.start_client("client-a", 0, 1, 600)
    raw = []
    for i, bad in enumerate(malformed):
        key = bad.key_level or GOOD_KEYS[i % len(GOOD_KEYS)]
        levels = (config.hash_prefix, str(config.bucket_for_key(key)), bad.key_level)
        raw.append((Destination(tuple(filter(None, levels))), bad.body, bad.headers))
    for i, body in enumerate(FOREIGN_BODIES):
        key = f"foreign-{i}"
        raw.append(
            (event_destination(config.hash_prefix, config.bucket_for_key(key), key), body, {})
        )
    thirds = [raw[0::3], raw[1::3], raw[2::3]]
    events = tmp_path / "events.jsonl"
    lines = (orjson.dumps({"key": k, "data": r}).decode() for r in range(ROUNDS) for k in GOOD_KEYS)
    events.write_text("\n".join(lines) + "\n")
    good = ROUNDS * len(GOOD_KEYS)

    asyncio.run(_publish_raw(broker.url, group_name, thirds[0]))
    publisher = deployment.start_publisher("pub", "--input", str(events), "--rate", "200")
    time.sleep(1.0)
    asyncio.run(_publish_raw(broker.url, group_name, thirds[1]))
    assert publisher.wait(30) == 0, publisher.log_tail()
    asyncio.run(_publish_raw(broker.url, group_name, thirds[2]))

    report = validate()

    assert report["published"] == good
    assert report["unique"] == good, "the client stopped processing after a malformed message"
    assert report["lost"] == 0
    assert report["reordered"] == 0
    assert report["duplicates"] == 0
    assert report["per_client"] == {"client-a": good}
    assert report["unsequenced"] == len(FOREIGN_BODIES)
    # The subject as the broker gave it: on Message DB the stream name.
    subject_prefix = (
        f"{naming.event_category(config.hash_prefix)}-"
        if broker.kind == "messagedb"
        else f"{config.hash_prefix}."
    )
    letters = dead_letters(broker.url, group_name, len(malformed))
    by_body = {body: headers for body, headers in letters}
    assert len(letters) == len(malformed), [body[:40] for body, _ in letters]
    for bad in malformed:
        assert bad.body in by_body, f"{bad.body[:60]!r} was not dead-lettered"
        headers = by_body[bad.body]
        assert bad.reason in headers.get("Lbg-Reason", ""), (bad.body[:60], headers)
        assert headers.get("Lbg-Client") == "client-a"
        assert headers.get("Lbg-Subject", "").startswith(subject_prefix)
        assert all(headers.get(name) == value for name, value in bad.headers.items()), headers
    assert_clean_log(deployment, "client-a")
    assert_nothing_left_unacked(broker, group_name)
    validator_log = deployment.daemons["validator"].log_path.read_text()
    assert validator_log.count("dead letter (no key and sequence)") == len(malformed)


# --- (c) a handler that always fails for one key -----------------------------------------------

FLAKY_HANDLER = '''\
"""Test handler: fails on the key "poison", otherwise does what the default handler does."""

from lbg.handlers import republish


def handle(event, context):
    if event.key == "poison":
        raise RuntimeError("poison pill " + str(event.seq))
    return republish(event, context)
'''


def test_a_key_the_handler_always_fails_on_is_parked_after_retries_not_lost(
    make_group,
    deployment: LocalDeployment,
    validate,
    broker: BrokerEndpoint,
    group_name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "flaky_handler.py").write_text(FLAKY_HANDLER)
    inherited = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), inherited])))
    make_group()
    deployment.start_client(
        "client-a", 0, 1, 600, "--handler", "flaky_handler:handle", "--retries", "1"
    )
    keys = [f"key-{i}" for i in range(5)]
    lines = []
    for round_ in range(10):
        batch = [*keys, "poison"] if round_ < 3 else keys
        lines.extend(orjson.dumps({"key": key, "data": round_}).decode() for key in batch)
    events = tmp_path / "events.jsonl"
    events.write_text("\n".join(lines) + "\n")
    publisher = deployment.start_publisher("pub", "--input", str(events))
    assert publisher.wait(30) == 0, publisher.log_tail()

    report = validate()

    assert report["published"] == 53
    assert (report["parked"], report["dead_lettered"]) == (3, 0), "the poison key is parked"
    assert report["lost"] == 0, "dead-lettered events must not count as lost"
    assert report["reordered"] == 0
    assert report["unique"] == 50
    assert report["per_client"] == {"client-a": 50}
    assert_clean_log(deployment, "client-a")
    assert_nothing_left_unacked(broker, group_name)


# --- (d) bad lines in the publisher's input ----------------------------------------------------


def test_bad_input_lines_are_logged_and_skipped_and_the_rest_published(
    make_group, broker: BrokerEndpoint, group_name: str, tmp_path: Path
) -> None:
    make_group()
    events = tmp_path / "events.jsonl"
    events.write_text(
        "\n".join(
            [
                '{"key": "a", "data": 1}',
                "not json",
                '{"key": "b"}',
                '{"data": "no key"}',
                '{"key": "a", "data": 2}',
                '{"key": 5}',
                "",
                '{"key": "c"}',
                '["key", "d"]',
            ]
        )
        + "\n"
    )

    result = run(
        "hashed-publisher",
        "--broker-url",
        broker.url,
        "--group",
        group_name,
        "--input",
        str(events),
        "--json",
    )

    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    stats = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert stats["acked"] == 4
    assert stats["rejected_input"] == 4
    assert stats["keys"] == 3
    warnings = [line for line in result.stderr.splitlines() if "skipped input line" in line]
    assert [w.split(f"{events}:")[1].split(":")[0] for w in warnings] == ["2", "4", "6", "9"]
    last = result.stderr.strip().splitlines()[-1]
    assert "published 4 events" in last and "skipped 4 bad input lines" in last, last
    deadline = time.monotonic() + 10  # RabbitMQ's queue figures lag half a second
    while sum(int(row[1]) for row in queue_rows(broker, group_name)) != 4:
        assert time.monotonic() < deadline, queue_rows(broker, group_name)
        time.sleep(0.25)


def test_a_line_that_is_not_utf8_is_skipped_like_any_bad_line(
    make_group, broker: BrokerEndpoint, group_name: str, tmp_path: Path
) -> None:
    make_group()
    events = tmp_path / "events.jsonl"
    events.write_bytes(b'{"key": "a"}\n{"key": "\xff"}\n{"key": "b"}\n')

    result = run(
        "hashed-publisher",
        "--broker-url",
        broker.url,
        "--group",
        group_name,
        "--input",
        str(events),
        "--json",
    )

    assert result.returncode == 1, result.stderr
    assert f"{events}:2" in result.stderr
    stats = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert (stats["acked"], stats["rejected_input"]) == (2, 1)
