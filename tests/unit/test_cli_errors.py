"""What a user who mistypes a flag sees: one line naming the flag, and exit 2 for any bad input;
cg-admin's connection flags work before or after the subcommand."""

import pytest
from click.testing import CliRunner

from lbg import retry
from lbg.broker.base import BrokerError
from lbg.cli import admin, client, publisher, validator
from lbg.cli.tool import main as lbg

BAD_FLAGS = [
    (
        admin.main,
        ["create", "--group", "g", "--hash-count", "2", "--queue-count", "4"],
        "--queue-count: must be <= --hash-count (2), got 4",
    ),
    (
        admin.main,
        ["create", "--group", "g", "--hash-function", "md5"],
        '--hash-function: expected one of java, murmur2, messagedb, got "md5"',
    ),
    (admin.main, ["show", "no/such"], "GROUP: expected 1-64 characters"),
    (publisher.main, ["--group", "g", "--rate", "-1"], "--rate: expected a number >= 0, got -1.0"),
    (
        client.main,
        ["--group", "g", "--client-index", "3", "--client-count", "2"],
        "--client-index: must be < --client-count (2), got 3",
    ),
    (
        publisher.main,
        ["--group", "g", "--input", "/nonexistent/events.jsonl"],
        "--input: cannot read '/nonexistent/events.jsonl' (no such file or directory)",
    ),
    (validator.main, ["--group", "a b"], "--group: expected 1-64 characters"),
    (lbg, ["status", "--group", "a.b"], "--group: expected 1-64 characters"),
]


@pytest.mark.parametrize(("command", "args", "expected"), BAD_FLAGS)
def test_a_bad_flag_is_one_line_naming_the_flag_and_exits_2(command, args, expected) -> None:
    result = CliRunner().invoke(command, args)

    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert expected in lines[0]
    assert "override" not in lines[0]


def test_a_bad_key_in_a_config_file_still_names_the_file_and_key(tmp_path) -> None:
    config = tmp_path / "admin.toml"
    config.write_text('[group]\nname = "g"\nhash_count = 2\nqueue_count = 4\n')

    result = CliRunner().invoke(admin.main, ["--config", str(config), "create"])

    assert result.exit_code == 2
    assert f"{config}: [group] queue_count: must be <= hash_count (2), got 4" in result.output


@pytest.mark.parametrize("where", ["before", "after"])
def test_cg_admin_takes_the_broker_url_before_or_after_the_subcommand(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[str] = []

    async def connect(settings, *_args):
        asked.append(settings.url)
        raise BrokerError("not this time")

    monkeypatch.setattr(admin, "connect_broker", connect)
    flags = ["--broker-url", "nats://mq.example:4333"]
    args = [*flags, "list"] if where == "before" else ["list", *flags]

    result = CliRunner().invoke(admin.main, args)

    assert asked == ["nats://mq.example:4333"], result.output
    assert result.exit_code == 1


@pytest.mark.parametrize("command", [publisher.main, client.main, validator.main])
def test_connect_retry_zero_gives_up_after_one_attempt(
    command, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[str] = []

    async def connect(settings, *_args):
        attempts.append(settings.url)
        raise BrokerError(f"cannot connect to {settings.url}")

    monkeypatch.setattr(retry, "connect_broker", connect)

    result = CliRunner().invoke(
        command, ["--broker-url", "nats://mq.example:4333", "--group", "g", "--connect-retry", "0"]
    )

    assert attempts == ["nats://mq.example:4333"]
    assert result.exit_code == 1
    assert result.output.strip().endswith("cannot connect to nats://mq.example:4333")


def test_a_bad_soak_client_config_is_refused_before_anything_starts(tmp_path) -> None:
    config = tmp_path / "fast.toml"
    config.write_text("[client]\nlease = -1\n")

    result = CliRunner().invoke(lbg, ["soak", "--client-config", str(config)])

    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1, result.output
    assert f"error: --client-config: {config}: [client] lease: expected a number > 0" in lines[0]
