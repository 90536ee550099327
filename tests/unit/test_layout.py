"""The package layout keeps its promises (README, "Where things live"): no import cycles, the
test bench apart from the product, pure rules in model/, a short top level, short modules."""

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "services"
PACKAGE = SERVICES / "lbg"
# The cli commands that run the local test bench (lbg demo/local/soak, make replay).
RUNS_DEVSTACK = {
    "lbg.cli.tool",
    "lbg.cli.local",
    "lbg.cli.soak",
    "lbg.cli.replay_local",
    "lbg.cli.spark_cluster",
}
MODEL_MAY_IMPORT = {"orjson"}
MAX_TOP_LEVEL = 12
MAX_LINES = 610


def module_name(path: Path) -> str:
    """`lbg.model.group` for services/lbg/model/group.py, `lbg.model` for its __init__.py."""
    return ".".join(path.relative_to(SERVICES).with_suffix("").parts).removesuffix(".__init__")


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below `node` except the bodies of `if TYPE_CHECKING:` blocks."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
            yield from (n for orelse in child.orelse for n in (orelse, *_runtime_nodes(orelse)))
            continue
        yield child
        yield from _runtime_nodes(child)


def imported(name: str) -> set[str]:
    """What module `name` imports when it runs (lazy imports in functions included), as
    absolute names; `from lbg.broker import base` counts as lbg.broker.base."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parts, node.module] if node.level else [node.module or ""])
            base = base.strip(".")
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES else base)
    return found


GRAPH = {name: imported(name) for name in MODULES}


def internal(name: str) -> set[str]:
    """The lbg modules `name` imports."""
    return {m for m in GRAPH[name] if m in MODULES and m != name}


def test_no_import_cycles() -> None:
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = " -> ".join([*path[path.index(name) :], name])
            pytest.fail(f"import cycle: {cycle}")
        if name in done:
            return
        for target in sorted(internal(name)):
            visit(target, [*path, name])
        done.add(name)

    for name in MODULES:
        visit(name, [])


def test_nothing_in_the_product_imports_the_devstack() -> None:
    offenders = {
        name: sorted(m for m in GRAPH[name] if m.startswith("lbg.devstack"))
        for name in MODULES
        if not name.startswith("lbg.devstack") and name not in RUNS_DEVSTACK
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_model_imports_only_the_standard_library_orjson_and_model() -> None:
    allowed = set(sys.stdlib_module_names) | MODEL_MAY_IMPORT
    offenders = {}
    for name in MODULES:
        if name == "lbg.model" or name.startswith("lbg.model."):
            bad = {
                m
                for m in GRAPH[name]
                if not m.startswith("lbg.model") and m.split(".")[0] not in allowed
            }
            if bad:
                offenders[name] = sorted(bad)
    assert offenders == {}


def test_the_top_level_stays_short() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(loose) <= MAX_TOP_LEVEL, loose


def test_no_module_is_over_about_600_lines() -> None:
    long = {
        name: count
        for name, path in MODULES.items()
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}


# What each folder may import (README, "Where things live"); "top" is a top-level module.
MAY_IMPORT = {
    "model": {"model"},
    "broker": {"model", "broker", "top"},
    "client": {"model", "broker", "client", "top"},
    "admin": {"model", "broker", "admin", "top"},
    "replay": {"model", "broker", "replay", "top"},
    "top": {"model", "broker", "client", "top"},
}


def folder(name: str) -> str:
    """`model` for lbg.model.group; `top` for a module at the package's top level."""
    parts = name.split(".")
    if len(parts) > 2 or (MODULES[name].name == "__init__.py" and len(parts) == 2):
        return parts[1]
    return "top"


def test_each_folder_imports_only_what_the_readme_says() -> None:
    offenders = {
        name: sorted(m for m in internal(name) if folder(m) not in MAY_IMPORT[folder(name)])
        for name in MODULES
        if folder(name) in MAY_IMPORT
    }
    assert {name: found for name, found in offenders.items() if found} == {}
