"""The config file `make test-solace` gives the daemons holds the broker the variables name."""

from pathlib import Path

import pytest
from tests.support.solace_env import ENV, missing, write_config

from lbg.settings import (
    AdminConfig,
    ClientConfig,
    PublisherConfig,
    ValidatorConfig,
    load_config,
)

VALUES = {
    "url": "tcps://broker.example:55443",
    "vpn": "lbg-vpn",
    "admin_url": "https://broker.example:1943",
    "user": "lbg-test",
    "password": "pw-messaging",
    "admin_user": "vpn-admin",
    "admin_password": "pw-semp",
}


@pytest.mark.parametrize("schema", [AdminConfig, ClientConfig, PublisherConfig, ValidatorConfig])
def test_every_daemon_reads_the_broker_from_the_written_config(
    schema: type, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, name in ENV.items():
        monkeypatch.setenv(name, VALUES[key])
    assert missing() == []
    broker = load_config(str(write_config(tmp_path)), schema, {}).broker
    assert (broker.url, broker.vpn, broker.admin_url) == (
        VALUES["url"],
        VALUES["vpn"],
        VALUES["admin_url"],
    )
    assert (broker.user, broker.admin_user) == (VALUES["user"], VALUES["admin_user"])
    assert broker.secret() == VALUES["password"]
    assert broker.admin_secret() == VALUES["admin_password"]
    assert VALUES["password"] not in (tmp_path / "solace.toml").read_text()


def test_missing_names_every_unset_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(ENV["url"], VALUES["url"])
    assert missing() == [name for key, name in ENV.items() if key != "url"]
