"""Every SEMP request cg-admin's Solace flows send, checked against the public SEMP v2 spec.

For each request captured by the in-memory SEMP server: the path template exists with that
method, the query parameters are ones the operation takes, and the JSON body validates
against the operation's body definition with no unknown properties, with every attribute
the operation's table marks Required and none it marks Read-Only or Deprecated.

The spec is /work/shared/solace/semp-v2-config.json next to the repository, or $LBG_SEMP_SPEC.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest

from lbg.broker.solace.provision import Provisioner
from lbg.broker.solace.semp import CONFIG, SempClient
from lbg.model.group import GroupConfig
from support.semp_server import Request, SempServer

SPEC_ENV = "LBG_SEMP_SPEC"
SPEC_IN_SHARED = "shared/solace/semp-v2-config.json"
# Beside the repository (../shared), else the workplace's shared folder (a clone elsewhere).
CANDIDATES = (Path(__file__).parents[2].parent / SPEC_IN_SHARED, Path("/work") / SPEC_IN_SHARED)


def spec_path() -> Path:
    if os.environ.get(SPEC_ENV):
        return Path(os.environ[SPEC_ENV])
    return next((path for path in CANDIDATES if path.is_file()), CANDIDATES[0])


@cache
def load_spec() -> dict[str, Any]:
    path = spec_path()
    if not path.is_file():
        pytest.skip(f"SEMP v2 spec not found at {path} (set {SPEC_ENV} to check requests)")
    return orjson.loads(path.read_bytes())


@cache
def strict_definitions() -> dict[str, Any]:
    """The spec's definitions with additionalProperties: false on every object."""
    closed = copy.deepcopy(load_spec()["definitions"])
    for definition in closed.values():
        if "properties" in definition:
            definition["additionalProperties"] = False
    return closed


def template_regex(template: str) -> re.Pattern[str]:
    """A path template as a regex: each {param} is one raw (still escaped) segment part."""
    parts = re.split(r"(\{[^}]+\})", template)
    return re.compile("".join("[^/,]+" if p.startswith("{") else re.escape(p) for p in parts) + "$")


def operation_for(spec: dict[str, Any], method: str, raw_path: str) -> tuple[str, dict[str, Any]]:
    """The (template, operation) a request addresses; fails the test if there is none."""
    matches = [t for t in spec["paths"] if template_regex(t).match(raw_path)]
    assert matches, f"no SEMP path template matches {raw_path}"
    template = min(matches, key=lambda t: t.count("{"))
    operation = spec["paths"][template].get(method.lower())
    assert operation is not None, f"{method} is not allowed on {template}"
    return template, operation


def attribute_table(operation: dict[str, Any]) -> dict[str, set[str]]:
    """From the operation's description table: attribute -> its flags (Required, Read-Only...)."""
    lines = operation.get("description", "").splitlines()
    flags: dict[str, set[str]] = {}
    header: list[str] = []
    for line in lines:
        cells = [c.strip() for c in line.split("|")]
        if cells and cells[0] == "Attribute":
            header = cells
            continue
        if not header or len(cells) != len(header):
            header = [] if not line.strip() else header
            continue
        if set(cells[0]) <= {":", "-"}:
            continue
        flags[cells[0]] = {header[i] for i, c in enumerate(cells) if c == "x"}
    return flags


def parameters(spec: dict[str, Any], operation: dict[str, Any]) -> list[dict[str, Any]]:
    resolved = []
    for parameter in operation.get("parameters", []):
        if "$ref" in parameter:
            parameter = spec["parameters"][parameter["$ref"].rsplit("/", 1)[-1]]
        resolved.append(parameter)
    return resolved


def check_request(request: Request) -> None:
    """Fail with a clear message if `request` is not one the spec allows."""
    spec = load_spec()
    assert request.api == CONFIG, f"{request.method} {request.path}: not the config API"
    template, operation = operation_for(spec, request.method, request.raw_path)
    where = f"{request.method} {template}"
    taken = parameters(spec, operation)
    query = {p["name"] for p in taken if p["in"] == "query"}
    unknown = set(request.params) - query
    assert not unknown, f"{where}: query parameters {sorted(unknown)} are not in the spec"
    body_parameter = next((p for p in taken if p["in"] == "body"), None)
    if body_parameter is None:
        assert request.body is None, f"{where}: the operation takes no body"
        return
    assert request.body is not None, f"{where}: the operation needs a body"
    schema = {**body_parameter["schema"], "definitions": strict_definitions()}
    errors = sorted(
        jsonschema.Draft4Validator(schema).iter_errors(request.body), key=lambda e: e.path
    )
    assert not errors, f"{where}: body {request.body} invalid: {errors[0].message}"
    table = attribute_table(operation)
    for attribute, flags in table.items():
        if "Required" in flags:
            assert attribute in request.body, f"{where}: required attribute {attribute} missing"
        for flag in ("Read-Only", "Deprecated"):
            if flag in flags:
                assert attribute not in request.body, f"{where}: {attribute} is {flag}"


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


@pytest.fixture
def captured() -> Iterator[list[Request]]:
    """Requests of every cg-admin flow: create (new and shared client), list, read, clash,
    a failed create with its undo, and deletes; SEMP-side paging included."""
    load_spec()
    server = SempServer()
    semp = SempClient("http://broker:8080", "admin", "pw", transport=server.transport())
    admin = Provisioner(semp, "default")
    first = GroupConfig(hash_prefix="orders", hash_count=12, queue_count=3, client_username="cu")
    second = GroupConfig(
        hash_prefix="pay", hash_count=4, queue_count=2, client_username="cu", exclusive=False
    )
    run(admin.create_group("g1", first, client_password="secret"))
    run(admin.create_group("g2", second))
    run(admin.list_groups())
    run(admin.read_group("g1"))
    with pytest.raises(Exception, match="already exists"):
        run(admin.create_group("g1", first))
    server.fail("POST", lambda path: path.endswith("/jndiQueues"))
    third = GroupConfig(hash_prefix="x", hash_count=2, queue_count=1, client_username="other")
    with pytest.raises(Exception, match="injected failure"):
        run(admin.create_group("g3", third, client_password="pw"))
    run(admin.delete_group("g2"))
    run(admin.delete_group("g1"))
    run(semp.close())
    yield server.requests


def test_every_request_matches_the_spec(captured: list[Request]) -> None:
    methods = {r.method for r in captured}
    assert methods == {"GET", "POST", "DELETE"}
    for request in captured:
        check_request(request)


def test_every_kind_of_object_was_exercised(captured: list[Request]) -> None:
    spec = load_spec()
    posted = {operation_for(spec, r.method, r.raw_path)[0] for r in captured if r.method == "POST"}
    assert posted == {
        "/msgVpns/{msgVpnName}/queues",
        "/msgVpns/{msgVpnName}/queues/{queueName}/subscriptions",
        "/msgVpns/{msgVpnName}/jndiQueues",
        "/msgVpns/{msgVpnName}/clientUsernames",
        "/msgVpns/{msgVpnName}/clientProfiles",
        "/msgVpns/{msgVpnName}/aclProfiles",
        "/msgVpns/{msgVpnName}/aclProfiles/{aclProfileName}/publishTopicExceptions",
        "/msgVpns/{msgVpnName}/aclProfiles/{aclProfileName}/subscribeTopicExceptions",
    }


def test_the_acl_exception_objects_used_are_in_the_spec_and_not_deprecated() -> None:
    spec = load_spec()
    for kind in ("publishTopicExceptions", "subscribeTopicExceptions"):
        collection = f"/msgVpns/{{msgVpnName}}/aclProfiles/{{aclProfileName}}/{kind}"
        assert "post" in spec["paths"][collection]
        assert not spec["paths"][collection]["post"].get("deprecated", False)
        noun = kind[0].upper() + kind[1:-1]
        definition = spec["definitions"][f"MsgVpnAclProfile{noun}"]
        attribute = kind[:-1]
        assert {attribute, f"{attribute}Syntax"} <= set(definition["properties"])
        assert "smf" in definition["properties"][f"{attribute}Syntax"]["enum"]


def test_jndi_physical_name_limit_is_what_the_code_enforces() -> None:
    from lbg.broker.solace.provision import PHYSICAL_NAME_MAX

    spec = load_spec()
    assert spec["definitions"]["MsgVpnJndiQueue"]["properties"]["physicalName"]["maxLength"] == (
        PHYSICAL_NAME_MAX
    )


def sent(method: str, path: str, body: dict[str, Any] | None, **params: str) -> Request:
    """A request as the server would have recorded it."""
    return Request(method, CONFIG, path, path, params, body, 200)


QUEUES = "/msgVpns/v/queues"


@pytest.mark.parametrize(
    ("request_", "problem"),
    [
        (sent("POST", QUEUES, {"queueName": "q", "bogus": 1}), "invalid"),
        (sent("POST", QUEUES, {"accessType": "exclusive"}), "required attribute queueName"),
        (sent("POST", QUEUES, {"queueName": "q", "permission": "all"}), "invalid"),
        (sent("POST", QUEUES, {"queueName": "q", "maxMsgSpoolUsage": "1"}), "invalid"),
        (sent("POST", QUEUES, {"queueName": "q", "msgVpnName": "v"}), "Read-Only"),
        (sent("PATCH", QUEUES, {"queueName": "q"}), "not allowed"),
        (sent("POST", "/msgVpns/v/nonsense", {}), "no SEMP path"),
        (sent("GET", QUEUES, None, limit="5"), "not in the spec"),
        (
            sent(
                "POST",
                "/msgVpns/v/clientProfiles",
                {"clientProfileName": "p", "tcpMaxWindowSize": 64},
            ),
            "Deprecated",
        ),
    ],
)
def test_the_checker_rejects_what_the_spec_forbids(request_: Request, problem: str) -> None:
    with pytest.raises(AssertionError, match=problem):
        check_request(request_)
