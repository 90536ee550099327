"""TLS settings: checked at load time with one-line errors, turned into verifying contexts, and
used by the management API (https against a throwaway CA) and the Solace session."""

from __future__ import annotations

import asyncio
import http.server
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from solace.messaging.messaging_service import MessagingService
from tests.support.tls import Pki, make_pki

from lbg.broker.base import BrokerError
from lbg.broker.rabbitmq.management import ManagementApi
from lbg.broker.solace import session as solace
from lbg.settings import BrokerSettings, ClientConfig, ConfigError, load_config
from lbg.tls import client_context, https_verify, wants_tls


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def load_error(tmp_path: Path, broker: str) -> str:
    path = tmp_path / "client.toml"
    path.write_text(f"[broker]\n{broker}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ClientConfig)
    message = str(caught.value)
    assert len(message.splitlines()) == 1
    return message.removeprefix(f"{path}: ")


def test_a_missing_tls_file_is_named_with_its_key(tmp_path: Path) -> None:
    missing = "/nonexistent-lbg/ca.pem"  # short: a long value would be cut in the message
    for key in ("tls_ca_file", "tls_cert_file"):
        message = load_error(tmp_path, f'{key} = "{missing}"')
        assert message == f'[broker] {key}: no such file "{missing}"'


def test_a_key_needs_its_certificate_and_plain_urls_refuse_tls(tmp_path: Path, pki: Pki) -> None:
    message = load_error(tmp_path, f'tls_key_file = "{pki.client_key}"')
    assert message == "[broker] tls_key_file: needs tls_cert_file (the client certificate) too"
    message = load_error(tmp_path, f'url = "amqp://h:5672"\ntls_ca_file = "{pki.ca}"')
    assert message == "[broker] tls_ca_file: a amqp:// URL never uses TLS; use amqps://"


def test_tls_is_wanted_for_tls_schemes_or_tls_keys(pki: Pki) -> None:
    assert wants_tls(BrokerSettings(url="tls://h:4222"))
    assert wants_tls(BrokerSettings(url="amqps://h:5671"))
    assert not wants_tls(BrokerSettings(url="nats://h:4222"))
    assert wants_tls(BrokerSettings(url="nats://h:4222", tls_ca_file=str(pki.ca)))


def test_the_context_verifies_the_server_and_carries_the_client_certificate(pki: Pki) -> None:
    settings = BrokerSettings(
        url="tls://h:1",
        tls_ca_file=str(pki.ca),
        tls_cert_file=str(pki.client_cert),
        tls_key_file=str(pki.client_key),
    )
    context = client_context(settings)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "lbg test CA"),),)]


def test_an_unusable_tls_file_is_one_line_naming_the_key(pki: Pki) -> None:
    with pytest.raises(ConfigError, match=r"^\[broker\] tls_ca_file: cannot use '.*client-key"):
        client_context(BrokerSettings(url="tls://h:1", tls_ca_file=str(pki.client_key)))
    wrong_key = BrokerSettings(
        url="tls://h:1", tls_cert_file=str(pki.client_cert), tls_key_file=str(pki.server_key)
    )
    with pytest.raises(ConfigError, match=r"^\[broker\] tls_cert_file/tls_key_file: cannot use"):
        client_context(wrong_key)


def test_passwords_in_urls_are_masked_for_logs() -> None:
    shown = BrokerSettings(url="amqps://lbg:s3cret@h:5671/%2F").shown_url
    assert shown == "amqps://lbg:***@h:5671/%2F"
    assert BrokerSettings(url="nats://h:4222").shown_url == "nats://h:4222"
    assert BrokerSettings(url="nats://token@h:4222").shown_url == "nats://token@h:4222"
    cluster = BrokerSettings(url="nats://a:p1@h1:4222,nats://b:p2@h2:4222").shown_url
    assert cluster == "nats://a:***@h1:4222,nats://b:***@h2:4222"


@pytest.fixture
def https_api(pki: Pki) -> Iterator[str]:
    """A tiny https server with the test CA's server certificate, answering `{}` to GET."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.server_cert, pki.server_key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def get_overview(url: str, settings: BrokerSettings) -> object:
    api = ManagementApi(url, "admin", "pw", https_verify(settings))
    try:
        return await api.get("/overview")
    finally:
        await api.close()


def test_the_management_api_trusts_the_brokers_ca_over_https(https_api: str, pki: Pki) -> None:
    trusted = BrokerSettings(url="amqps://127.0.0.1:5671", tls_ca_file=str(pki.ca))
    assert asyncio.run(get_overview(https_api, trusted)) == {}
    with pytest.raises(BrokerError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(get_overview(https_api, BrokerSettings(url="amqps://127.0.0.1:5671")))


def test_solace_trusts_the_directory_of_the_ca_file(pki: Pki) -> None:
    configuration = solace.tls_strategy(str(pki.ca)).security_configuration
    assert str(pki.ca.parent) in [str(value) for value in configuration.values()]
    settings = BrokerSettings(url="tcps://127.0.0.1:55443", tls_ca_file=str(pki.ca), vpn="v")
    service = solace.build_service(settings, "x")
    assert isinstance(service, MessagingService) and not service.is_connected
