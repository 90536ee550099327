"""The operator commands take any daemon's config file as their --config, as their help says:
each shipped example in config/ is read (its other sections checked and ignored)."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from lbg.cli.admin import main as cg_admin
from lbg.cli.tool import main as lbg

CONFIGS = sorted((Path(__file__).parents[2] / "config").glob("*.toml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda path: path.name)
def test_status_reads_every_daemons_example_config(config: Path) -> None:
    url = f"memory://status-{config.stem}"
    created = CliRunner().invoke(cg_admin, ["--broker-url", url, "-q", "create", "--group", "g"])
    assert created.exit_code == 0, created.output

    connection = ["--config", str(config), "--broker-url", url, "--group", "g"]
    result = CliRunner().invoke(lbg, ["status", *connection, "--listen", "0.1"])

    assert result.exit_code == 0, result.output
    assert "unknown section" not in result.output
