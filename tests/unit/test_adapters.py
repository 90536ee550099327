"""lbg.broker.adapters: one table of adapters by URL scheme, read by every place that checks
a broker URL; the broker interface names no adapter."""

import ast
import importlib
from pathlib import Path

import pytest

from lbg.broker import CONNECT
from lbg.broker.adapters import ADAPTERS, SCHEMES, TLS_SCHEMES, adapter_for
from lbg.broker.base import Broker
from lbg.settings import BrokerSettings
from lbg.tls import wants_tls

CLASSES = {
    "nats": "lbg.broker.nats.adapter:NatsBroker",
    "rabbitmq": "lbg.broker.rabbitmq.adapter:RabbitBroker",
    "solace": "lbg.broker.solace.adapter:SolaceBroker",
    "messagedb": "lbg.broker.messagedb.adapter:MessageDbBroker",
    "memory": "lbg.broker.memory.adapter:MemoryBroker",
}
BASE = Path(__file__).resolve().parents[2] / "services" / "lbg" / "broker" / "base.py"


def broker_class(key: str) -> type[Broker]:
    """The adapter class of a table entry."""
    module, name = CLASSES[key].split(":")
    return getattr(importlib.import_module(module), name)


def test_every_scheme_has_one_adapter() -> None:
    assert len(SCHEMES) == len(set(SCHEMES))
    assert sorted(a.key for a in ADAPTERS) == sorted(CLASSES)
    assert TLS_SCHEMES.issubset(SCHEMES)
    for adapter in ADAPTERS:
        assert set(adapter.tls_instead) <= set(adapter.schemes) - adapter.tls_schemes
        assert set(adapter.tls_instead.values()) <= adapter.tls_schemes


@pytest.mark.parametrize("key", sorted(CLASSES))
def test_the_table_agrees_with_its_adapter_class(key: str) -> None:
    adapter = next(a for a in ADAPTERS if a.key == key)
    assert broker_class(key).resizable is adapter.resizable


@pytest.mark.parametrize("scheme", [*SCHEMES, "NATS", "http", "https", "kafka"])
def test_settings_and_tls_accept_exactly_the_tables_schemes(scheme: str) -> None:
    settings = BrokerSettings(url=f"{scheme}://host:1")
    adapter = adapter_for(scheme)
    if adapter is None:
        with pytest.raises(ValueError, match="expected <scheme>://<host>"):
            settings.validate()
        return
    settings.validate()
    assert wants_tls(settings) is (scheme.lower() in adapter.tls_schemes)


def test_the_broker_interface_names_no_adapter() -> None:
    source = BASE.read_text()
    names = {a.name for a in ADAPTERS} | set(CLASSES.values()) | {"Message DB", "postgresql"}
    strings = [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant)]
    for name in names:
        assert not any(isinstance(s, str) and name.split(":")[-1] in s for s in strings), name


def test_connect_broker_knows_how_every_adapter_connects() -> None:
    assert set(CONNECT) == {a.key for a in ADAPTERS}
