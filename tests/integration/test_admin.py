"""cg-admin on every real broker: create, clashes, the original JSON form, show, list, delete."""

import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import orjson
import pytest

from lbg.devstack.brokers import BrokerEndpoint
from lbg.devstack.deployment import script

Admin = Callable[..., subprocess.CompletedProcess[str]]


def unique(prefix: str = "a") -> str:
    return f"{prefix}{uuid.uuid4().hex[:10]}"


@pytest.fixture
def admin(broker: BrokerEndpoint) -> Iterator[Admin]:
    """Run `cg-admin --broker-url <url> ARGS`; groups it created are deleted afterwards."""
    created: set[str] = set()

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [script("cg-admin"), "--broker-url", broker.url, *broker.admin_args(), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if args[0] == "create" and "--group" in args and result.returncode == 0:
            created.add(args[args.index("--group") + 1])
        return result

    yield run
    for name in created:
        run("delete", name)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a failed command (no traceback, no log noise)."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def listed(admin: Admin) -> dict[str, dict]:
    result = admin("list", "--json")
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


def create(admin: Admin, name: str, prefix: str, hc: int, qc: int, *flags: str):
    return admin(
        "create",
        "--group",
        name,
        "--hash-prefix",
        prefix,
        "--hash-count",
        str(hc),
        "--queue-count",
        str(qc),
        *flags,
    )


def test_create_prints_each_queue_and_its_buckets(admin: Admin) -> None:
    name = unique()
    result = create(admin, name, name, 10, 3)

    assert result.returncode == 0, result.stderr
    queues = dict(re.findall(r"queue (\d+): \d+ buckets \[([\d, ]*)\]", result.stdout))
    assert queues == {"0": "0, 3, 6, 9", "1": "1, 4, 7", "2": "2, 5, 8"}
    assert f"'{name}'" in result.stdout
    assert listed(admin)[name] == {
        "HP": name,
        "HC": 10,
        "QC": 3,
        "QS": 100,
        "CU": "lbg-client",
        "HF": "java",
    }


def test_create_twice_fails_naming_the_clash_unless_if_not_exists(admin: Admin) -> None:
    name = unique()
    assert create(admin, name, name, 8, 2).returncode == 0

    again = create(admin, name, name, 8, 2)
    assert again.returncode == 1
    assert name in one_error_line(again)

    same = create(admin, name, name, 8, 2, "--if-not-exists")
    assert same.returncode == 0, same.stderr
    assert "already exists" in same.stdout

    different = create(admin, name, name, 8, 4, "--if-not-exists")
    assert name in one_error_line(different)
    assert listed(admin)[name]["QC"] == 2, "the existing group must be left as it was"


def test_a_hash_prefix_belongs_to_one_group(admin: Admin) -> None:
    first, second, prefix = unique("f"), unique("s"), unique("hp")
    assert create(admin, first, prefix, 8, 2).returncode == 0

    refused = create(admin, second, prefix, 8, 2)

    line = one_error_line(refused)
    assert prefix in line and first in line
    assert second not in listed(admin)
    # Nothing of the refused group was left behind: it can be created with its own prefix.
    retry = create(admin, second, unique("hp"), 8, 2)
    assert retry.returncode == 0, retry.stderr


def test_original_json_form_creates_the_group_and_drops_the_password(admin: Admin) -> None:
    name, prefix = unique(), unique("hp")
    original = orjson.dumps(
        {"HP": prefix, "HC": 100, "QC": 12, "QS": 100, "CU": "lg_cu1", "CP": "pw12345"}
    ).decode()

    result = admin("create", "--group", name, "--from-json", original)

    assert result.returncode == 0, result.stderr
    assert "pw12345" not in result.stdout + result.stderr
    assert len(re.findall(r"^  queue \d+: ", result.stdout, re.M)) == 12
    listing = admin("list", "--json")
    assert "pw12345" not in listing.stdout and "CP" not in listing.stdout
    config = orjson.loads(listing.stdout)[name]
    assert config == {"HP": prefix, "HC": 100, "QC": 12, "QS": 100, "CU": "lg_cu1", "HF": "java"}
    text = admin("list")
    assert "pw12345" not in text.stdout
    assert any(line.split("\t")[0] == name for line in text.stdout.splitlines())


def test_show_lists_every_queue_with_its_backlog(admin: Admin, broker_url: str) -> None:
    name = unique()
    assert create(admin, name, name, 12, 5).returncode == 0
    publisher = subprocess.run(
        [
            script("hashed-publisher"),
            "--broker-url",
            broker_url,
            "--group",
            name,
            "--keys",
            "20",
            "--count",
            "60",
            "--no-summary",
            "-q",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert publisher.returncode == 0, publisher.stderr

    # RabbitMQ's management API refreshes its queue figures every half second.
    deadline = time.monotonic() + 10
    while True:
        result = admin("show", name)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        rows = [line.split("\t") for line in lines[2:]]
        if sum(int(row[1]) for row in rows) == 60 or time.monotonic() > deadline:
            break
        time.sleep(0.25)

    assert lines[0].startswith(f"group '{name}': ")
    assert lines[1].split("\t") == ["queue", "backlog", "in-flight", "active client", "buckets"]
    assert [int(row[0]) for row in rows] == [0, 1, 2, 3, 4]
    assert sum(int(row[1]) for row in rows) == 60, "every unconsumed event is someone's backlog"
    assert all(row[2] == "0" and row[3] == "-" for row in rows), "no client is running"
    assert rows[0][4] == "[0, 5, 10]" and rows[4][4] == "[4, 9]"


def test_delete_removes_only_that_group(admin: Admin) -> None:
    doomed, survivor = unique("d"), unique("s")
    assert create(admin, doomed, doomed, 8, 2).returncode == 0
    assert create(admin, survivor, survivor, 8, 2).returncode == 0

    result = admin("delete", doomed)

    assert result.returncode == 0, result.stderr
    groups = listed(admin)
    assert doomed not in groups
    assert survivor in groups
    assert admin("show", survivor).returncode == 0
    assert admin("show", doomed).returncode != 0
    # Its streams went too: the same name and prefix can be created again from scratch.
    assert create(admin, doomed, doomed, 8, 2).returncode == 0


@pytest.mark.parametrize("command", ["show", "delete"])
def test_missing_group_is_one_line(admin: Admin, command: str) -> None:
    name = unique("missing")
    line = one_error_line(admin(command, name))
    assert name in line and "does not exist" in line


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        pytest.param(["--hash-count", "3", "--queue-count", "4"], ("--queue-count",), id="HC<QC"),
        pytest.param(["--queue-count", "0"], ("--queue-count",), id="QC=0"),
        pytest.param(["--hash-count", "0"], ("--hash-count",), id="HC=0"),
        pytest.param(["--hash-prefix", "a.b"], ("--hash-prefix",), id="HP=a.b"),
        pytest.param(["--hash-prefix", "_x"], ("--hash-prefix", "_x"), id="HP=_x"),
        pytest.param(
            ["--from-json", '{"HP": "hpj", "HC": 5, "QC": 12}'],
            ("HC", "hash_count"),
            id="json-HC<QC",
        ),
    ],
)
def test_impossible_parameters_are_one_line_and_create_nothing(
    admin: Admin, flags: list[str], fields: tuple[str, ...]
) -> None:
    name = unique("bad")
    result = admin("create", "--group", name, "--hash-prefix", f"hp{name}", *flags)

    line = one_error_line(result)
    assert any(field in line for field in fields), line
    assert name not in listed(admin)
