"""A small async client of Solace's SEMP v2 management API (config and monitor), with httpx.

Every failure becomes a SempError: one line with the method, the path, the HTTP status and
SEMP's own `meta.error.status` and `description`. List calls follow the cursor SEMP returns
in `meta.paging` until the last page.
"""

from __future__ import annotations

import ssl
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import httpx
import orjson

from lbg.broker.base import BrokerError

CONFIG = "/SEMP/v2/config"
MONITOR = "/SEMP/v2/monitor"
PAGE_SIZE = 100
TIMEOUT = 10.0
NOT_FOUND = "NOT_FOUND"
ALREADY_EXISTS = "ALREADY_EXISTS"


class SempError(BrokerError):
    """A SEMP request failed; `status` is SEMP's error status (e.g. NOT_FOUND) when it gave one."""

    def __init__(self, message: str, http_status: int | None = None, status: str | None = None):
        super().__init__(message)
        self.http_status = http_status
        self.status = status

    @property
    def not_found(self) -> bool:
        """SEMP answers a missing object with status NOT_FOUND (HTTP 400 or 404)."""
        return self.status == NOT_FOUND or (self.status is None and self.http_status == 404)


def segment(name: str) -> str:
    """One URL path segment: object names and topics ('/', '>', '*', ...) fully escaped."""
    return quote(name, safe="")


def api_root(url: str) -> str:
    """The broker's management root: `admin_url` without a trailing /SEMP/v2/... part."""
    root = url.rstrip("/")
    for suffix in (CONFIG, MONITOR, "/SEMP/v2", "/SEMP"):
        if root.endswith(suffix):
            return root[: -len(suffix)]
    return root


class SempClient:
    """One broker's SEMP v2 API with basic auth, JSON bodies and one-line errors."""

    def __init__(
        self,
        url: str,
        user: str,
        password: str,
        transport: httpx.AsyncBaseTransport | None = None,
        verify: ssl.SSLContext | bool = True,
    ) -> None:
        self.root = api_root(url)
        self._http = httpx.AsyncClient(
            base_url=self.root,
            auth=(user, password),
            timeout=TIMEOUT,
            trust_env=False,
            headers={"content-type": "application/json", "accept": "application/json"},
            transport=transport,
            verify=verify,
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def get(self, path: str, *, api: str = CONFIG, select: str | None = None) -> dict:
        """One object's attributes (`data`)."""
        params = {"select": select} if select else None
        return (await self.document("GET", path, api=api, params=params)).get("data") or {}

    async def find(self, path: str, *, api: str = CONFIG) -> dict | None:
        """One object's attributes, or None if SEMP says it does not exist."""
        try:
            return await self.get(path, api=api)
        except SempError as exc:
            if exc.not_found:
                return None
            raise

    async def exists(self, path: str) -> bool:
        return await self.find(path) is not None

    async def list(
        self,
        path: str,
        *,
        api: str = CONFIG,
        where: str | None = None,
        select: str | None = None,
    ) -> list[dict]:
        """Every object of a collection, page by page (`count`, then `cursor` from meta.paging)."""
        params: dict[str, str] = {"count": str(PAGE_SIZE)}
        if where:
            params["where"] = where
        if select:
            params["select"] = select
        items: list[dict] = []
        while True:
            document = await self.document("GET", path, api=api, params=params)
            items.extend(document.get("data") or [])
            cursor = _next_cursor(document)
            if cursor is None:
                return items
            params = {**params, "cursor": cursor}

    async def create(self, path: str, body: dict[str, Any]) -> dict:
        """POST a new object to a collection; its attributes as SEMP stored them."""
        return (await self.document("POST", path, body=body)).get("data") or {}

    async def delete(self, path: str) -> None:
        await self.document("DELETE", path)

    async def document(
        self,
        method: str,
        path: str,
        *,
        api: str = CONFIG,
        params: dict[str, str] | None = None,
        body: dict[str, Any] | None = None,
    ) -> dict:
        """The whole SEMP response (data, collections, links, meta) of one request."""
        content = orjson.dumps(body) if body is not None else None
        try:
            response = await self._http.request(
                method, f"{api}{path}", params=params, content=content
            )
        except httpx.HTTPError as exc:
            reason = str(exc) or "no answer"
            raise SempError(
                f"SEMP {self.root}: {type(exc).__name__}: {' '.join(reason.split())}"
            ) from None
        document = _json(response)
        if response.status_code >= 400 or "error" in document.get("meta", {}):
            raise _error(method, path, response, document)
        return document


def _json(response: httpx.Response) -> dict:
    try:
        document = orjson.loads(response.content) if response.content else {}
    except orjson.JSONDecodeError:
        return {}
    return document if isinstance(document, dict) else {}


def _error(method: str, path: str, response: httpx.Response, document: dict) -> SempError:
    """One line from SEMP's error envelope (or the bare HTTP status when there is none)."""
    error = document.get("meta", {}).get("error") or {}
    status = error.get("status")
    description = error.get("description") or response.text or response.reason_phrase
    text = " ".join(str(description).split())[:300]
    label = f"HTTP {response.status_code}" + (f" {status}" if status else "")
    return SempError(f"SEMP {method} {path}: {label}: {text}", response.status_code, status)


def _next_cursor(document: dict) -> str | None:
    """The cursor of the next page: `cursorQuery`, else the one inside `nextPageUri`."""
    paging = document.get("meta", {}).get("paging") or {}
    if paging.get("cursorQuery"):
        return str(paging["cursorQuery"])
    uri = paging.get("nextPageUri")
    if not uri:
        return None
    cursors = parse_qs(urlsplit(uri).query).get("cursor")
    return cursors[0] if cursors else None
