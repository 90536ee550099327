"""Every command answers --version from the package metadata, shows its defaults in --help,
and reads --config, --broker-url and --group from the environment too."""

import importlib
import importlib.metadata
import tomllib
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from lbg.cli import client, publisher

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
SCRIPTS = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]


def command(name: str) -> click.Command:
    """The click command behind a console script."""
    module, _, function = SCRIPTS[name].partition(":")
    return getattr(importlib.import_module(module), function)


def every_command(cmd: click.Command, path: str) -> Iterator[tuple[str, click.Command]]:
    """A command and, for a group, every subcommand under it."""
    yield path, cmd
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from every_command(sub, f"{path} {name}")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_version_comes_from_the_package_metadata(name: str) -> None:
    result = CliRunner().invoke(command(name), ["--version"], prog_name=name)
    assert result.exit_code == 0, result.output
    assert result.output == f"{name} {importlib.metadata.version('sticky-lbg')}\n"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_option_shows_one_default_at_most(name: str) -> None:
    for path, cmd in every_command(command(name), name):
        ctx = click.Context(cmd, info_name=path)
        for param in cmd.get_params(ctx):
            record = param.get_help_record(ctx)
            assert record is None or record[1].count("default:") <= 1, (path, record)


def test_daemon_help_shows_the_settings_defaults_and_env_vars() -> None:
    text = " ".join(CliRunner().invoke(client.main, ["--help"]).output.split())
    assert "nats://127.0.0.1:4222" in text
    assert "[default: 256]" in text  # --window, from ClientSettings
    assert "[default: lbg.handlers:republish]" in text
    for variable in ("LBG_CONFIG", "LBG_BROKER_URL", "LBG_GROUP"):
        assert f"env var: {variable}" in text
    text = " ".join(CliRunner().invoke(publisher.main, ["--help"]).output.split())
    assert "[default: --summary]" in text and "[default: 1000]" in text


def test_broker_url_from_the_environment_is_checked_like_the_flag() -> None:
    result = CliRunner().invoke(client.main, [], env={"LBG_BROKER_URL": "bogus"})
    assert result.exit_code == 2
    assert "error: --broker-url: expected <scheme>://<host>" in result.output
    assert "Traceback" not in result.output


def test_config_and_group_from_the_environment(tmp_path: Path) -> None:
    config = tmp_path / "client.toml"
    config.write_text("[client]\nwindow = 0\n")
    result = CliRunner().invoke(client.main, [], env={"LBG_CONFIG": str(config)})
    assert result.exit_code == 2
    assert f"{config}: [client] window: expected an integer >= 1, got 0" in result.output
    result = CliRunner().invoke(client.main, [], env={"LBG_GROUP": "not a name"})
    assert result.exit_code == 2
    assert "--group: expected 1-64 characters" in result.output
