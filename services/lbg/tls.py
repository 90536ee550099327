"""TLS towards the brokers: one client SSLContext built from the [broker] tls_* keys.

The broker's certificate and host name are always verified: against `tls_ca_file` when set,
else the system's CA certificates. `tls_cert_file` (and `tls_key_file`) add a client
certificate for brokers that require mutual TLS.
"""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

from lbg.broker.adapters import TLS_SCHEMES
from lbg.settings import BrokerSettings, ConfigError


def wants_tls(settings: BrokerSettings) -> bool:
    """TLS when the URL's scheme is a TLS one (tls, amqps, tcps) or any tls_* key is set."""
    configured = settings.tls_ca_file or settings.tls_cert_file
    return urlsplit(settings.url).scheme.lower() in TLS_SCHEMES or bool(configured)


def client_context(settings: BrokerSettings) -> ssl.SSLContext:
    """A verifying client context; ConfigError (one line naming the key) if a file is unusable."""
    try:
        context = ssl.create_default_context(cafile=settings.tls_ca_file)
    except (ssl.SSLError, OSError) as exc:
        raise _unusable("tls_ca_file", settings.tls_ca_file, exc) from None
    if settings.tls_cert_file is not None:
        try:
            context.load_cert_chain(settings.tls_cert_file, settings.tls_key_file)
        except (ssl.SSLError, OSError) as exc:
            key = "tls_cert_file" if settings.tls_key_file is None else "tls_cert_file/tls_key_file"
            raise _unusable(key, settings.tls_cert_file, exc) from None
    return context


def _unusable(key: str, path: str | None, exc: BaseException) -> ConfigError:
    """The one-line error for a TLS file that exists but cannot be used."""
    reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
    return ConfigError(f"[broker] {key}: cannot use {path!r} ({reason})")


def https_verify(settings: BrokerSettings) -> ssl.SSLContext | bool:
    """What a management API client (httpx) verifies https against: the broker's CA when
    `tls_ca_file` is set, else the system's CAs (True)."""
    return client_context(settings) if settings.tls_ca_file else True
