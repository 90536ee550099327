"""The Solace messaging service (the session): host, Message VPN, credentials, keepalive, TLS,
and connection attempts bounded so that connecting gives up within `connect_timeout`."""

from __future__ import annotations

import os
import ssl
from typing import Any

from solace.messaging.config.retry_strategy import RetryStrategy
from solace.messaging.config.solace_properties import (
    authentication_properties,
    service_properties,
    transport_layer_properties,
)
from solace.messaging.config.transport_security_strategy import TLS
from solace.messaging.messaging_service import MessagingService

from lbg.settings import BrokerSettings

RETRY_INTERVAL_MS = 500
ATTEMPT_TIMEOUT_MS = 2000
KEEP_ALIVE_MS = 1000
KEEP_ALIVE_MISSES = 3
DEFAULT_USERNAME = "default"


def connection_attempts(connect_timeout: float, hosts: int = 1) -> tuple[int, int]:
    """(retries, ms per attempt) for connecting within `connect_timeout` even when no host
    answers: every pass tries each host once, waiting RETRY_INTERVAL_MS after each failure
    (so a list of N hosts cannot give up in less than N-1 waits)."""
    budget = max(1, round(connect_timeout * 1000))
    per_host = (budget - (hosts - 1) * RETRY_INTERVAL_MS) // hosts
    attempt = max(1, min(ATTEMPT_TIMEOUT_MS, per_host))
    passes = (budget + RETRY_INTERVAL_MS) // (hosts * (attempt + RETRY_INTERVAL_MS))
    return max(0, passes - 1), attempt


def session_properties(settings: BrokerSettings) -> dict[str, Any]:
    """Host, Message VPN, basic credentials, keepalive, send timestamps, and connection
    attempts bounded so that connecting gives up within `connect_timeout`."""
    host_count = len(settings.url.split(","))  # an HA pair or list: "tcp://a,tcp://b"
    retries, attempt_ms = connection_attempts(settings.connect_timeout, host_count)
    return {
        transport_layer_properties.HOST: settings.url,
        service_properties.VPN_NAME: settings.vpn,
        authentication_properties.SCHEME_BASIC_USER_NAME: settings.user or DEFAULT_USERNAME,
        authentication_properties.SCHEME_BASIC_PASSWORD: settings.secret() or "",
        transport_layer_properties.KEEP_ALIVE_INTERVAL: KEEP_ALIVE_MS,
        transport_layer_properties.KEEP_ALIVE_WITHOUT_RESPONSE_LIMIT: KEEP_ALIVE_MISSES,
        transport_layer_properties.CONNECTION_ATTEMPTS_TIMEOUT: attempt_ms,
        transport_layer_properties.CONNECTION_RETRIES: retries,
        transport_layer_properties.CONNECTION_RETRIES_PER_HOST: 0,
        transport_layer_properties.RECONNECTION_ATTEMPTS_WAIT_INTERVAL: RETRY_INTERVAL_MS,
        service_properties.GENERATE_SEND_TIMESTAMPS: True,
    }


def build_service(settings: BrokerSettings, name: str) -> MessagingService:
    """The (unconnected) messaging service: gives up connecting within `connect_timeout`,
    reconnects forever once connected, and uses TLS with the system's CA certificates for
    tcps:// URLs."""
    builder = (
        MessagingService.builder()
        .from_properties(session_properties(settings))
        .with_reconnection_retry_strategy(RetryStrategy.forever_retry(RETRY_INTERVAL_MS))
    )
    if settings.url.lower().startswith("tcps://"):
        builder = builder.with_transport_security_strategy(tls_strategy(settings.tls_ca_file))
    return builder.build(name)


def tls_strategy(ca_file: str | None = None) -> TLS:
    """Validate the broker's certificate and name against a trust store directory: the one
    holding `ca_file` (the API reads every CA file there), else the system's CA directory."""
    capath = os.path.dirname(os.path.abspath(ca_file)) if ca_file else None
    capath = capath or ssl.get_default_verify_paths().capath
    return TLS.create().with_certificate_validation(
        ignore_expiration=False, validate_server_name=True, trust_store_file_path=capath
    )
