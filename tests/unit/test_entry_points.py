"""Every console script of the package resolves to a callable: a daemon that cannot even be
imported fails here in milliseconds rather than in an integration test's log."""

import importlib
import tomllib
from pathlib import Path

import pytest

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
SCRIPTS = tomllib.loads(PYPROJECT.read_text())["project"]["scripts"]


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_the_console_script_imports(name: str) -> None:
    module, _, function = SCRIPTS[name].partition(":")
    assert callable(getattr(importlib.import_module(module), function))


def test_the_public_api_imports() -> None:
    lbg = importlib.import_module("lbg")
    for name in lbg.__all__:
        assert getattr(lbg, name) is not None
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        lbg.Nothing  # noqa: B018
