"""An in-memory SEMP v2 broker for tests, served through httpx.MockTransport (no network).

It follows the spec's semantics for the objects cg-admin uses: POST creates (400
ALREADY_EXISTS when the object is there, 400 NOT_FOUND when its parent or a referenced
profile is not), GET one (404 NOT_FOUND unless told otherwise), GET a collection with
`count`, `cursor`, `where` and `select` and the paging metadata, DELETE (children too).
The monitor API answers queue figures and flows that a test sets. Every request is kept.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlencode

import httpx
import orjson

CONFIG = "/SEMP/v2/config"
MONITOR = "/SEMP/v2/monitor"
VPNS = "msgVpns"

# Identifying attributes of each collection, in the order they appear in an object's URL.
IDENTIFIERS: dict[str, tuple[str, ...]] = {
    "queues": ("queueName",),
    "subscriptions": ("subscriptionTopic",),
    "jndiQueues": ("queueName",),
    "clientUsernames": ("clientUsername",),
    "clientProfiles": ("clientProfileName",),
    "aclProfiles": ("aclProfileName",),
    "publishTopicExceptions": ("publishTopicExceptionSyntax", "publishTopicException"),
    "subscribeTopicExceptions": ("subscribeTopicExceptionSyntax", "subscribeTopicException"),
}
DEFAULTS: dict[str, dict[str, Any]] = {
    "queues": {
        "accessType": "exclusive",
        "permission": "no-access",
        "ingressEnabled": False,
        "egressEnabled": False,
        "maxMsgSpoolUsage": 5000,
        "owner": "",
    },
    "jndiQueues": {"physicalName": ""},
    "clientUsernames": {
        "aclProfileName": "default",
        "clientProfileName": "default",
        "enabled": False,
    },
    "aclProfiles": {
        "clientConnectDefaultAction": "disallow",
        "publishTopicDefaultAction": "disallow",
        "subscribeTopicDefaultAction": "disallow",
    },
}
REFERENCES = {"aclProfileName": "aclProfiles", "clientProfileName": "clientProfiles"}
WRITE_ONLY = frozenset({"password"})

Key = tuple[str, ...]


@dataclass(frozen=True)
class Request:
    """One request as the server saw it: method, API path (after the base), query and body."""

    method: str
    api: str
    path: str
    raw_path: str
    params: dict[str, str]
    body: dict[str, Any] | None
    status: int


@dataclass
class QueueFigures:
    """What the monitor API reports for one queue."""

    backlog: int = 0
    unacked: int = 0
    flows: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Failure:
    method: str
    matches: Callable[[str], bool]
    skip: int


class SempError(Exception):
    """An error answer: HTTP code, SEMP status and description."""

    def __init__(self, http: int, status: str, description: str) -> None:
        super().__init__(description)
        self.http = http
        self.status = status
        self.description = description


class SempServer:
    """One broker with one or more Message VPNs, in memory."""

    def __init__(self, vpns: tuple[str, ...] = ("default",), not_found_http: int = 404) -> None:
        self.vpns = set(vpns)
        self.not_found_http = not_found_http
        self.objects: dict[Key, dict[str, Any]] = {}
        self.requests: list[Request] = []
        self.monitor: dict[str, QueueFigures] = {}
        self._failures: list[_Failure] = []

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def fail(self, method: str, matches: Callable[[str], bool], skip: int = 0) -> None:
        """Make the (skip+1)-th `method` request whose decoded path matches fail, once."""
        self._failures.append(_Failure(method, matches, skip))

    def names(self, *collection: str) -> list[str]:
        """Ids of the objects directly in a collection, e.g. names('default', 'queues')."""
        return sorted(k[-1] for k in self.objects if k[:-1] == collection)

    def object(self, *key: str) -> dict[str, Any]:
        return self.objects[key]

    def handle(self, request: httpx.Request) -> httpx.Response:
        raw = request.url.raw_path.decode().split("?", 1)[0]
        api = CONFIG if raw.startswith(CONFIG) else MONITOR if raw.startswith(MONITOR) else ""
        segments = [unquote(s) for s in raw[len(api) :].split("/")[1:]] if api else []
        params = {k: v for k, v in request.url.params.items()}
        body = orjson.loads(request.content) if request.content else None
        segments_path = "/" + "/".join(segments)
        response = self._answer(request, api, raw, segments, body)
        self.requests.append(
            Request(
                request.method,
                api,
                segments_path,
                raw[len(api) :],
                params,
                body,
                response.status_code,
            )
        )
        return response

    def _answer(
        self,
        request: httpx.Request,
        api: str,
        raw: str,
        segments: list[str],
        body: dict[str, Any] | None,
    ) -> httpx.Response:
        try:
            if not api or len(segments) < 3 or segments[0] != VPNS:
                raise SempError(400, "INVALID_PATH", f"unknown path {raw}")
            self._maybe_fail(request.method, "/" + "/".join(segments))
            if segments[1] not in self.vpns:
                raise SempError(
                    400, "NOT_FOUND", f"Could not find match for msgVpnName {segments[1]}"
                )
            if api == MONITOR:
                return self._monitor(request, segments)
            return self._config(request, segments, body)
        except SempError as exc:
            return self._error(request, exc)

    def _maybe_fail(self, method: str, path: str) -> None:
        for failure in self._failures:
            if failure.method == method and failure.matches(path):
                if failure.skip > 0:
                    failure.skip -= 1
                    continue
                self._failures.remove(failure)
                raise SempError(400, "INVALID_PARAMETER", "injected failure")

    def _config(
        self, request: httpx.Request, segments: list[str], body: dict[str, Any] | None
    ) -> httpx.Response:
        key = tuple(segments[1:])
        collection = key[-1] if len(key) % 2 == 0 else key[-2]
        if collection not in IDENTIFIERS:
            raise SempError(400, "INVALID_PATH", f"unknown collection {collection}")
        is_collection = len(key) % 2 == 0
        if request.method == "POST" and is_collection:
            return self._ok(request, self._create(key, collection, body or {}))
        if request.method == "GET" and is_collection:
            return self._list(request, key)
        if request.method == "GET":
            return self._ok(request, self._visible(self._find(key, collection)))
        if request.method == "DELETE" and not is_collection:
            self._find(key, collection)
            for other in [k for k in self.objects if k[: len(key)] == key]:
                del self.objects[other]
            return self._ok(request, None)
        raise SempError(405, "NOT_SUPPORTED", f"{request.method} not supported here")

    def _find(self, key: Key, collection: str) -> dict[str, Any]:
        if key not in self.objects:
            label = ",".join(IDENTIFIERS[collection])
            raise SempError(self.not_found_http, "NOT_FOUND", f"Could not find match for {label}")
        return self.objects[key]

    def _create(self, key: Key, collection: str, body: dict[str, Any]) -> dict[str, Any]:
        parent = key[:-1]
        if len(parent) > 1 and parent not in self.objects:
            raise SempError(400, "NOT_FOUND", f"Could not find match for parent {parent[-1]}")
        missing = [a for a in IDENTIFIERS[collection] if a not in body]
        if missing:
            raise SempError(400, "MISSING_ATTRIBUTE", f"Missing attribute {missing[0]}")
        identity = ",".join(str(body[a]) for a in IDENTIFIERS[collection])
        path = (*key, identity)
        if path in self.objects:
            raise SempError(
                400, "ALREADY_EXISTS", f"Object {identity} already exists in {collection}"
            )
        for attribute, target in REFERENCES.items():
            value = body.get(attribute)
            if (
                collection == "clientUsernames"
                and value
                and (key[0], target, value) not in self.objects
            ):
                raise SempError(400, "NOT_FOUND", f"Could not find match for {attribute} {value}")
        record = {**DEFAULTS.get(collection, {}), **body, "msgVpnName": key[0]}
        if len(parent) > 1:
            record[IDENTIFIERS[parent[-2]][0]] = parent[-1]
        self.objects[path] = record
        return self._visible(record)

    def _list(self, request: httpx.Request, key: Key) -> httpx.Response:
        params = request.url.params
        items = [v for k, v in self.objects.items() if k[:-1] == key]
        for condition in filter(None, params.get("where", "").split(",")):
            attribute, _, pattern = condition.partition("==")
            items = [i for i in items if fnmatch.fnmatchcase(str(i.get(attribute, "")), pattern)]
        count = int(params.get("count", "10"))
        start = int(params.get("cursor", "c0")[1:])
        page = items[start : start + count]
        selected = [f for f in params.get("select", "").split(",") if f]
        data = [
            {k: v for k, v in self._visible(i).items() if not selected or k in selected}
            for i in page
        ]
        meta: dict[str, Any] = {"count": len(items)}
        if start + count < len(items):
            cursor = f"c{start + count}"
            query = urlencode({**params, "cursor": cursor})
            meta["paging"] = {
                "cursorQuery": cursor,
                "nextPageUri": f"{request.url.scheme}://{request.url.host}{request.url.path}?{query}",
            }
        return self._ok(request, data, meta)

    def _monitor(self, request: httpx.Request, segments: list[str]) -> httpx.Response:
        if request.method != "GET" or len(segments) < 4 or segments[2] != "queues":
            raise SempError(400, "INVALID_PATH", "unknown monitor path")
        record = self._find((segments[1], "queues", segments[3]), "queues")
        figures = self.monitor.get(segments[3], QueueFigures())
        if len(segments) == 5 and segments[4] == "txFlows":
            return self._ok(request, figures.flows, {"count": len(figures.flows)})
        data = {**self._visible(record), "txUnackedMsgCount": figures.unacked}
        collections = {"msgs": {"count": figures.backlog}, "txFlows": {"count": len(figures.flows)}}
        return self._ok(request, data, extra={"collections": collections})

    @staticmethod
    def _visible(record: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in record.items() if k not in WRITE_ONLY}

    @staticmethod
    def _ok(
        request: httpx.Request,
        data: Any,
        meta: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> httpx.Response:
        document: dict[str, Any] = {
            "meta": {
                "request": {"method": request.method, "uri": str(request.url)},
                "responseCode": 200,
                **(meta or {}),
            },
            **(extra or {}),
        }
        if data is not None:
            document["data"] = data
        return httpx.Response(200, content=orjson.dumps(document))

    @staticmethod
    def _error(request: httpx.Request, exc: SempError) -> httpx.Response:
        document = {
            "meta": {
                "error": {
                    "code": 6 if exc.status == "NOT_FOUND" else 10,
                    "description": exc.description,
                    "status": exc.status,
                },
                "request": {"method": request.method, "uri": str(request.url)},
                "responseCode": exc.http,
            }
        }
        return httpx.Response(exc.http, content=orjson.dumps(document))
