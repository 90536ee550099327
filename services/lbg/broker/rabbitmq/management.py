"""The few calls of RabbitMQ's management HTTP API the adapter needs, with one-line errors.

The group config lives in a global runtime parameter (the JNDI analogue); users, permissions
and queue figures are read and written here too. AMQP itself cannot do any of that.
"""

from __future__ import annotations

import ssl
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from lbg.broker.base import BrokerError

if TYPE_CHECKING:
    import httpx

TIMEOUT = 10.0


class NotFound(BrokerError):
    """The management API answered 404 for the object."""


def path_segment(name: str) -> str:
    """One URL path segment: vhost '/' becomes %2F, as the management API expects."""
    return quote(name, safe="")


class ManagementApi:
    """A small async client of one RabbitMQ node's management API."""

    def __init__(
        self, base_url: str, user: str, password: str, verify: ssl.SSLContext | bool = True
    ) -> None:
        import httpx  # here: a client never needs it, and it was a tenth of its imports

        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=f"{self.base_url}/api",
            auth=(user, password),
            timeout=TIMEOUT,
            trust_env=False,
            headers={"content-type": "application/json"},
            verify=verify,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def get(self, path: str, **params: str) -> Any:
        """GET a JSON document; NotFound on 404, BrokerError on any other failure."""
        response = await self._call("GET", path, params=params or None)
        return orjson.loads(response.content) if response.content else None

    async def put(self, path: str, body: dict[str, Any]) -> None:
        await self._call("PUT", path, content=orjson.dumps(body))

    async def delete(self, path: str) -> None:
        await self._call("DELETE", path)

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        import httpx

        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise BrokerError(
                f"management API {self.base_url}: {type(exc).__name__}: {exc or 'no answer'}"
            ) from None
        if response.status_code == 404:
            raise NotFound(f"{method} {path}: not found")
        if response.status_code >= 400:
            raise BrokerError(
                f"management API {method} {path}: {response.status_code} {_reason(response)}"
            )
        return response


def _reason(response: httpx.Response) -> str:
    """The `reason` RabbitMQ puts in its error bodies, on one line."""
    try:
        body = orjson.loads(response.content)
        text = str(body.get("reason") or body.get("error") or body)
    except (orjson.JSONDecodeError, AttributeError):
        text = response.text or response.reason_phrase
    return " ".join(text.split())[:300]
