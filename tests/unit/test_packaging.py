"""The bare install is the daemons only: Spark, Arrow, pandas, Locust and matplotlib come
with the [replay] and [loadtest] extras, no command imports them before it needs them, and
a missing extra is one line naming it."""

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lbg.cli.common import needs_extra

REPO = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
HEAVY = ("pyspark", "pyarrow", "pandas", "numpy", "locust", "matplotlib")


def test_the_bare_install_has_no_heavy_dependency() -> None:
    names = " ".join(PROJECT["dependencies"]).lower()
    assert not [name for name in HEAVY if name in names]
    extras = PROJECT["optional-dependencies"]
    assert {"pyspark", "pyarrow"} <= {r.split("[")[0].split(">")[0] for r in extras["replay"]}
    assert {"locust", "matplotlib"} <= {r.split(">")[0] for r in extras["loadtest"]}
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    assert PROJECT["license"] == "Apache-2.0"


def test_every_dependency_is_pinned_in_the_constraints_file() -> None:
    pinned = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line
    }
    for requirement in PROJECT["dependencies"]:
        name = requirement.split("[")[0].split(">")[0].split("<")[0].split("=")[0].strip()
        assert name.lower() in pinned, name


@pytest.mark.parametrize("name", sorted(PROJECT["scripts"]))
def test_no_command_imports_a_heavy_module_at_start(name: str) -> None:
    module = PROJECT["scripts"][name].partition(":")[0]
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    assert not [m for m in loaded if m.partition(".")[0] in HEAVY], name


def test_the_client_imports_no_http_server_unless_it_serves_metrics() -> None:
    """aiohttp's import is a tenth of a client's start, and a joining member waits for it."""
    code = "import sys, lbg.cli.client; print('aiohttp' in sys.modules)"
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert loaded.stdout.strip() == "False"


def test_a_missing_extra_is_one_line_naming_it(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited, needs_extra():
        raise ModuleNotFoundError("No module named 'pyarrow'", name="pyarrow")
    assert exited.value.code == 1
    assert "needs pyarrow, from the [replay] extra: pip install 'sticky-lbg[replay]'" in (
        capsys.readouterr().err
    )
    with pytest.raises(ModuleNotFoundError), needs_extra():
        raise ModuleNotFoundError("No module named 'lbg.nothing'", name="lbg.nothing")
