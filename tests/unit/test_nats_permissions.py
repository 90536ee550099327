"""The rendered NATS users: each reads only its own replies, and names cannot widen a rule."""

from __future__ import annotations

import pytest

from lbg.broker.nats.connection import inbox_prefix
from lbg.broker.nats.permissions import authorization_block, main


def test_each_user_subscribes_to_its_own_inbox_prefix_only() -> None:
    block = authorization_block("orders", "orders", publisher_user="pub-a", client_user="cu-a")
    assert '"_INBOX.pub-a.>"' in block
    assert '"_INBOX.cu-a.>"' in block
    assert '"_INBOX.>"' not in block
    assert inbox_prefix("pub-a") == "_INBOX.pub-a"


@pytest.mark.parametrize("user", [None, "", "a.b", "a*", "a>", "a b"])
def test_a_user_no_subject_token_can_carry_gets_the_shared_prefix(user: str | None) -> None:
    assert inbox_prefix(user) == "_INBOX"


@pytest.mark.parametrize(
    "args",
    [
        ["--group", "*", "--hash-prefix", "orders"],
        ["--group", "orders", "--hash-prefix", ">"],
        ["--group", "orders", "--hash-prefix", "orders", "--client-user", "a.b"],
    ],
)
def test_wildcards_and_dots_are_refused_in_one_line(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "expected letters, digits, '-' or '_'" in error
