"""cg-admin create --category: a group over an existing category is Message DB's alone, and
the refusal comes before any connection, in one line."""

import pytest
from click.testing import CliRunner

from lbg.cli.admin import main


@pytest.mark.parametrize("url", ["nats://127.0.0.1:1", "amqp://127.0.0.1:1", "tcp://127.0.0.1:1"])
def test_other_brokers_refuse_a_category_in_one_line(url: str) -> None:
    result = CliRunner().invoke(
        main, ["--broker-url", url, "-q", "create", "--group", "g", "--category", "account"]
    )

    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    scheme = url.partition(":")[0]
    assert "CA (category) 'account'" in lines[0] and f"{scheme}://" in lines[0]
    assert "cannot connect" not in lines[0]


def test_a_category_with_another_hash_function_is_refused_naming_hf() -> None:
    url = "postgresql://127.0.0.1:1/x"
    args = ["--broker-url", url, "-q", "create", "--group", "g", "--category", "account"]
    result = CliRunner().invoke(main, [*args, "--hash-function", "java"])

    assert result.exit_code != 0
    assert result.output.strip().count("\n") == 0
    assert "HF (hash function): must be messagedb" in result.output
