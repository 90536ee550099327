"""cg-admin's Solace flows end to end against the in-memory SEMP server: no broker, no network."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import httpx
import pytest
from test_semp_contract import check_request

from lbg.broker.base import BrokerError, GroupExists, GroupNotFound
from lbg.broker.nats.adapter import NatsBroker
from lbg.broker.solace import claims, provision
from lbg.broker.solace.adapter import queue_status
from lbg.broker.solace.provision import Provisioner
from lbg.broker.solace.semp import PAGE_SIZE, SempClient, SempError
from lbg.model.group import GroupConfig
from support.semp_server import IDENTIFIERS, QueueFigures, SempServer

VPN = "default"
CONFIG = GroupConfig(hash_prefix="orders", hash_count=10, queue_count=4, client_username="cu1")


@pytest.fixture
def server() -> SempServer:
    return SempServer()


@pytest.fixture
def admin(server: SempServer) -> Iterator[Provisioner]:
    semp = SempClient("http://broker:8080", "admin", "secret", transport=server.transport())
    yield Provisioner(semp, VPN)
    asyncio.run(semp.close())


def run(coroutine):
    return asyncio.run(coroutine)


def test_create_makes_the_original_objects(server: SempServer, admin: Provisioner) -> None:
    run(admin.create_group("g1", CONFIG, client_password="pw"))
    queues = [f"lbg.g1.q{n}" for n in range(4)]
    assert server.names(VPN, "queues") == sorted([*queues, "lbg.g1.out", "lbg.g1.owners"])
    for n, name in enumerate(queues):
        queue = server.object(VPN, "queues", name)
        assert queue["accessType"] == "exclusive"
        assert queue["permission"] == "no-access"
        assert queue["ingressEnabled"] is queue["egressEnabled"] is True
        assert queue["maxMsgSpoolUsage"] == 100
        assert queue["owner"] == "cu1"
        expected = [f"orders/{b}/>" for b in CONFIG.buckets_for_queue(n)]
        assert server.names(VPN, "queues", name, "subscriptions") == sorted(expected)
    assert server.names(VPN, "queues", "lbg.g1.q1", "subscriptions") == [
        "orders/1/>",
        "orders/5/>",
        "orders/9/>",
    ]
    output = server.object(VPN, "queues", "lbg.g1.out")
    assert (output["accessType"], output["permission"]) == ("non-exclusive", "read-only")
    assert server.names(VPN, "queues", "lbg.g1.out", "subscriptions") == ["_lbg/g1/>"]
    jndi = server.object(VPN, "jndiQueues", "lbg/g1")
    assert GroupConfig.from_json(jndi["physicalName"]) == CONFIG
    user = server.object(VPN, "clientUsernames", "cu1")
    assert user["password"] == "pw"
    assert (user["aclProfileName"], user["clientProfileName"], user["enabled"]) == (
        "cu1",
        "cu1",
        True,
    )


def test_acl_profile_lets_the_client_publish_only_its_outputs_and_heartbeats(
    server: SempServer, admin: Provisioner
) -> None:
    run(admin.create_group("g1", CONFIG))
    acl = server.object(VPN, "aclProfiles", "cu1")
    assert acl["clientConnectDefaultAction"] == "allow"
    assert acl["publishTopicDefaultAction"] == "disallow"
    assert acl["subscribeTopicDefaultAction"] == "disallow"
    assert server.names(VPN, "aclProfiles", "cu1", "publishTopicExceptions") == [
        "smf,_lbg/g1/>",
        "smf,_lbgctl/g1/>",
    ]
    assert server.names(VPN, "aclProfiles", "cu1", "subscribeTopicExceptions") == [
        "smf,_lbgctl/g1/>"
    ]
    profile = server.object(VPN, "clientProfiles", "cu1")
    assert profile["allowGuaranteedMsgReceiveEnabled"] is True
    assert profile["allowGuaranteedMsgSendEnabled"] is True
    assert profile["allowGuaranteedEndpointCreateEnabled"] is False
    assert "password" not in server.object(VPN, "clientUsernames", "cu1")


def smf_matches(pattern: str, topic: str) -> bool:
    """Solace SMF topic matching: '*' is one whole level, a final '>' one or more levels."""
    want, have = pattern.split("/"), topic.split("/")
    if want[-1] == ">":
        return len(have) >= len(want) and all(
            w in ("*", h) for w, h in zip(want[:-1], have, strict=False)
        )
    return len(want) == len(have) and all(w in ("*", h) for w, h in zip(want, have, strict=True))


def test_the_claims_queue_keeps_claims_for_a_while_and_only_its_client_reads_it(
    server: SempServer, admin: Provisioner
) -> None:
    run(admin.create_group("g1", CONFIG, client_password="pw"))
    run(
        admin.create_group(
            "g2", dataclasses.replace(CONFIG, hash_prefix="o", client_username="cu2")
        )
    )
    owners = server.object(VPN, "queues", "lbg.g1.owners")
    assert (owners["accessType"], owners["permission"], owners["owner"]) == (
        "non-exclusive",
        "no-access",
        "cu1",
    )
    assert owners["respectTtlEnabled"] is True
    assert owners["maxTtl"] == provision.CLAIM_TTL_SECONDS > 10 * claims.CLAIM_TIMEOUT
    assert server.names(VPN, "queues", "lbg.g1.owners", "subscriptions") == ["_lbgctl/g1/owners/>"]
    topic = provision.claim_topic("g1", 3)
    assert smf_matches("_lbgctl/g1/owners/>", topic)
    allowed = server.names(VPN, "aclProfiles", "cu1", "publishTopicExceptions")
    assert any(smf_matches(name.split(",", 1)[1], topic) for name in allowed)
    others = server.names(VPN, "aclProfiles", "cu2", "publishTopicExceptions")
    assert not any(smf_matches(name.split(",", 1)[1], topic) for name in others)
    assert not smf_matches(provision.control_topics("g1"), "_lbgctl/g2/owners/0")


def test_upgrade_adds_the_claims_queue_to_an_old_group_once(
    server: SempServer, admin: Provisioner
) -> None:
    run(admin.create_group("g1", CONFIG))
    run(admin.semp.delete(admin.paths.queue("lbg.g1.owners")))  # as made before claims

    assert run(admin.upgrade_group("g1", CONFIG)) == ["claims queue 'lbg.g1.owners'"]
    assert run(admin.upgrade_group("g1", CONFIG)) == []
    assert server.names(VPN, "queues", "lbg.g1.owners", "subscriptions") == ["_lbgctl/g1/owners/>"]
    run(admin.delete_group("g1"))
    assert server.names(VPN, "queues") == []


def test_read_list_delete(server: SempServer, admin: Provisioner) -> None:
    other = GroupConfig(hash_prefix="pay", hash_count=4, queue_count=2, client_username="cu2")
    run(admin.create_group("g1", CONFIG))
    run(admin.create_group("g2", other))
    assert run(admin.read_group("g1")) == CONFIG
    assert run(admin.list_groups()) == {"g1": CONFIG, "g2": other}
    run(admin.delete_group("g1"))
    assert run(admin.list_groups()) == {"g2": other}
    assert server.names(VPN, "queues") == ["lbg.g2.out", "lbg.g2.owners", "lbg.g2.q0", "lbg.g2.q1"]
    assert server.names(VPN, "clientUsernames") == ["cu2"]
    assert server.names(VPN, "aclProfiles") == ["cu2"]
    assert server.names(VPN, "clientProfiles") == ["cu2"]
    with pytest.raises(GroupNotFound, match="'g1' does not exist"):
        run(admin.read_group("g1"))
    with pytest.raises(GroupNotFound):
        run(admin.delete_group("g1"))


def test_a_shared_client_username_lives_as_long_as_its_last_group(
    server: SempServer, admin: Provisioner
) -> None:
    second = GroupConfig(hash_prefix="pay", hash_count=4, queue_count=2, client_username="cu1")
    run(admin.create_group("g1", CONFIG, client_password="pw"))
    run(admin.create_group("g2", second))
    exceptions = server.names(VPN, "aclProfiles", "cu1", "publishTopicExceptions")
    assert exceptions == ["smf,_lbg/g1/>", "smf,_lbg/g2/>", "smf,_lbgctl/g1/>", "smf,_lbgctl/g2/>"]
    run(admin.delete_group("g1"))
    assert server.names(VPN, "clientUsernames") == ["cu1"]
    assert server.names(VPN, "aclProfiles", "cu1", "publishTopicExceptions") == [
        "smf,_lbg/g2/>",
        "smf,_lbgctl/g2/>",
    ]
    run(admin.delete_group("g2"))
    assert server.names(VPN, "clientUsernames") == []
    assert server.names(VPN, "aclProfiles") == []
    assert server.names(VPN, "clientProfiles") == []
    assert server.names(VPN, "jndiQueues") == []


def test_delete_leaves_other_objects_alone(server: SempServer, admin: Provisioner) -> None:
    semp = admin.semp
    run(semp.create(f"/msgVpns/{VPN}/queues", {"queueName": "lbg.g1.q9"}))
    run(semp.create(f"/msgVpns/{VPN}/queues", {"queueName": "lbg.g10.q0"}))
    run(semp.create(f"/msgVpns/{VPN}/jndiQueues", {"queueName": "other", "physicalName": "x"}))
    run(admin.create_group("g1", CONFIG))
    run(admin.delete_group("g1"))
    assert server.names(VPN, "queues") == ["lbg.g1.q9", "lbg.g10.q0"]
    assert server.names(VPN, "jndiQueues") == ["other"]


@pytest.mark.parametrize(
    ("prepare", "clash"),
    [
        ("jndiQueues:lbg/g1", "group 'g1' already exists"),
        ("queues:lbg.g1.q2", "queue 'lbg.g1.q2' already exists"),
        ("queues:lbg.g1.out", "queue 'lbg.g1.out' already exists"),
        ("clientProfiles:cu1", "client profile 'cu1' already exists"),
        ("aclProfiles:cu1", "ACL profile 'cu1' already exists"),
        ("clientUsernames:cu1", "client username 'cu1' already exists with ACL profile 'default'"),
    ],
)
def test_clash_detection_creates_nothing(
    server: SempServer, admin: Provisioner, prepare: str, clash: str
) -> None:
    collection, name = prepare.split(":")
    identifier = {
        "jndiQueues": "queueName",
        "queues": "queueName",
        "clientProfiles": "clientProfileName",
        "aclProfiles": "aclProfileName",
        "clientUsernames": "clientUsername",
    }[collection]
    run(admin.semp.create(f"/msgVpns/{VPN}/{collection}", {identifier: name}))
    before = dict(server.objects)
    posts = sum(r.method == "POST" for r in server.requests)
    with pytest.raises(GroupExists, match=clash):
        run(admin.create_group("g1", CONFIG))
    assert server.objects == before
    assert sum(r.method == "POST" for r in server.requests) == posts


def test_a_hash_prefix_in_use_is_a_clash(server: SempServer, admin: Provisioner) -> None:
    run(admin.create_group("g1", CONFIG))
    before = dict(server.objects)
    same_prefix = GroupConfig(hash_prefix="orders", hash_count=4, queue_count=2)
    with pytest.raises(GroupExists, match="hash prefix 'orders' is already used by group 'g1'"):
        run(admin.create_group("g2", same_prefix))
    assert server.objects == before


@pytest.mark.parametrize(
    "where",
    [
        "/msgVpns/default/clientUsernames",
        "/msgVpns/default/queues/lbg.g1.q2/subscriptions",
        "/msgVpns/default/queues",
        "/msgVpns/default/jndiQueues",
    ],
)
def test_a_failure_part_way_undoes_what_was_created(
    server: SempServer, admin: Provisioner, where: str
) -> None:
    semp = admin.semp
    run(semp.create(f"/msgVpns/{VPN}/queues", {"queueName": "unrelated"}))
    before = dict(server.objects)
    server.fail("POST", lambda path: path == where, skip=2 if where.endswith("/queues") else 0)
    with pytest.raises(
        BrokerError, match=r"cannot create group 'g1': SEMP POST .*injected failure"
    ):
        run(admin.create_group("g1", CONFIG))
    assert server.objects == before
    created = [
        f"{r.path}/{','.join(str(r.body[a]) for a in IDENTIFIERS[r.path.rsplit('/', 1)[-1]])}"
        for r in server.requests
        if r.method == "POST" and r.status == 200 and not r.path.endswith("/subscriptions")
    ][1:]
    deletes = [r.path for r in server.requests if r.method == "DELETE"]
    assert created
    assert deletes == created[::-1]


def test_undo_also_removes_exceptions_added_to_an_adopted_client(
    server: SempServer, admin: Provisioner
) -> None:
    run(admin.create_group("g1", CONFIG))
    before = dict(server.objects)
    second = GroupConfig(hash_prefix="pay", hash_count=4, queue_count=2, client_username="cu1")
    server.fail("POST", lambda path: path.endswith("/jndiQueues"))
    with pytest.raises(BrokerError, match="cannot create group 'g2'"):
        run(admin.create_group("g2", second))
    assert server.objects == before


def test_config_json_over_200_characters_is_refused(
    server: SempServer, admin: Provisioner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(GroupConfig, "to_json", lambda self: "x" * 201)
    with pytest.raises(BrokerError, match=r"201 characters; .*physicalName holds at most 200"):
        run(admin.create_group("g1", CONFIG))
    assert server.objects == {}
    monkeypatch.setattr(GroupConfig, "to_json", lambda self: '{"HP":"a","HC":1,"QC":1}'.ljust(200))
    run(admin.create_group("g1", GroupConfig(hash_prefix="a", hash_count=1, queue_count=1)))
    assert len(server.object(VPN, "jndiQueues", "lbg/g1")["physicalName"]) == 200


def test_a_bad_group_name_is_refused_before_any_request(
    server: SempServer, admin: Provisioner
) -> None:
    with pytest.raises(BrokerError, match="group name"):
        run(admin.create_group("bad/name", CONFIG))
    assert server.requests == []


def test_list_follows_the_cursor_over_many_pages(server: SempServer, admin: Provisioner) -> None:
    count = PAGE_SIZE * 2 + 5
    for n in range(count):
        config = GroupConfig(hash_prefix=f"p{n}", hash_count=1, queue_count=1)
        body = {"queueName": f"lbg/g{n}", "physicalName": config.to_json()}
        run(admin.semp.create(f"/msgVpns/{VPN}/jndiQueues", body))
    run(admin.semp.create(f"/msgVpns/{VPN}/jndiQueues", {"queueName": "jms/x", "physicalName": ""}))
    groups = run(admin.list_groups())
    assert len(groups) == count
    pages = [r for r in server.requests if r.method == "GET" and r.path.endswith("/jndiQueues")]
    assert len(pages) == 3
    assert "cursor" not in pages[0].params
    assert pages[1].params["cursor"] and pages[2].params["cursor"]


def test_an_unreadable_config_is_skipped_by_list_and_an_error_for_read(
    server: SempServer, admin: Provisioner
) -> None:
    body = {"queueName": "lbg/broken", "physicalName": "{not json"}
    run(admin.semp.create(f"/msgVpns/{VPN}/jndiQueues", body))
    assert run(admin.list_groups()) == {}
    with pytest.raises(BrokerError, match="group 'broken': stored config is invalid"):
        run(admin.read_group("broken"))


def test_semp_errors_are_one_line_with_status_and_description(
    server: SempServer, admin: Provisioner
) -> None:
    run(admin.semp.create(f"/msgVpns/{VPN}/queues", {"queueName": "q"}))
    with pytest.raises(SempError) as caught:
        run(admin.semp.create(f"/msgVpns/{VPN}/queues", {"queueName": "q"}))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("SEMP POST /msgVpns/default/queues: HTTP 400 ALREADY_EXISTS: ")
    assert "already exists" in message
    assert caught.value.status == "ALREADY_EXISTS"
    with pytest.raises(SempError, match="HTTP 404 NOT_FOUND: Could not find match"):
        run(admin.semp.get(f"/msgVpns/{VPN}/queues/nope"))


def test_not_found_is_recognised_whatever_the_http_code() -> None:
    server = SempServer(not_found_http=400)
    semp = SempClient("http://broker:8080/SEMP/v2/config", "a", "b", transport=server.transport())
    admin = Provisioner(semp, VPN)
    with pytest.raises(GroupNotFound):
        run(admin.read_group("g1"))
    run(admin.create_group("g1", CONFIG))
    assert run(admin.read_group("g1")) == CONFIG
    assert server.requests[0].raw_path == "/msgVpns/default/jndiQueues/lbg%2Fg1"


def test_an_unreachable_semp_is_one_line_broker_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    semp = SempClient("http://broker:8080", "a", "b", transport=httpx.MockTransport(refuse))
    with pytest.raises(BrokerError, match=r"^SEMP http://broker:8080: ConnectError: connection"):
        run(Provisioner(semp, VPN).list_groups())


def test_topics_are_escaped_in_paths(server: SempServer, admin: Provisioner) -> None:
    second = GroupConfig(hash_prefix="pay", hash_count=4, queue_count=2, client_username="cu1")
    run(admin.create_group("g1", CONFIG))
    run(admin.create_group("g2", second))
    run(admin.delete_group("g1"))
    deleted = {r.raw_path for r in server.requests if r.method == "DELETE"}
    acl = "/msgVpns/default/aclProfiles/cu1"
    assert f"{acl}/publishTopicExceptions/smf,_lbg%2Fg1%2F%3E" in deleted
    assert f"{acl}/subscribeTopicExceptions/smf,_lbgctl%2Fg1%2F%3E" in deleted
    assert "/msgVpns/default/jndiQueues/lbg%2Fg1" in deleted


def test_queue_status_reads_the_monitor_api(server: SempServer, admin: Provisioner) -> None:
    run(admin.create_group("g1", CONFIG))
    server.monitor["lbg.g1.q1"] = QueueFigures(
        backlog=7,
        unacked=2,
        flows=[
            {"clientName": "c-standby", "activityState": "inactive"},
            {"clientName": "c-active", "activityState": "active-consumer"},
        ],
    )
    status = run(queue_status(admin.semp, VPN, "g1", CONFIG))
    assert [s.name for s in status] == [f"lbg.g1.q{n}" for n in range(4)]
    assert (status[1].backlog, status[1].in_flight, status[1].active_client) == (7, 2, "c-active")
    assert status[1].buckets == [1, 5, 9]
    assert (status[0].backlog, status[0].active_client) == (0, None)


def test_naming_is_documented_and_stable() -> None:
    assert provision.queue_name("g", 3) == "lbg.g.q3"
    assert provision.output_queue_name("g") == "lbg.g.out"
    assert provision.jndi_name("g") == "lbg/g"
    assert provision.bucket_subscriptions(CONFIG, 2) == ["orders/2/>", "orders/6/>"]
    for documented in ("`lbg.<g>.q<N>`", "`lbg.<g>.out`", "`lbg/<g>`", "`<HP>/<b>/>`"):
        assert documented in (provision.__doc__ or "")


PUBLISHER_EXCEPTIONS = ["smf,_lbg/g1/summary", "smf,orders/>"]


def test_grant_publisher_lets_it_publish_the_groups_events_and_summary_only(
    server: SempServer, admin: Provisioner
) -> None:
    run(admin.create_group("g1", CONFIG))
    run(admin.grant_publisher("g1", CONFIG, "pub", "pw"))
    user = server.object(VPN, "clientUsernames", "pub")
    assert (user["password"], user["enabled"]) == ("pw", True)
    assert (user["aclProfileName"], user["clientProfileName"]) == ("pub", "pub")
    acl = server.object(VPN, "aclProfiles", "pub")
    assert acl["clientConnectDefaultAction"] == "allow"
    assert acl["publishTopicDefaultAction"] == acl["subscribeTopicDefaultAction"] == "disallow"
    assert server.names(VPN, "aclProfiles", "pub", "publishTopicExceptions") == (
        PUBLISHER_EXCEPTIONS
    )
    assert server.names(VPN, "aclProfiles", "pub", "subscribeTopicExceptions") == []
    profile = server.object(VPN, "clientProfiles", "pub")
    assert profile["allowGuaranteedMsgSendEnabled"] is True
    assert profile["allowGuaranteedMsgReceiveEnabled"] is False
    assert profile["allowGuaranteedEndpointCreateEnabled"] is False
    for request in server.requests:
        check_request(request)


def test_a_publisher_serves_groups_until_revoked_from_the_last(
    server: SempServer, admin: Provisioner
) -> None:
    second = GroupConfig(hash_prefix="pay", hash_count=4, queue_count=2)
    run(admin.create_group("g1", CONFIG))
    run(admin.create_group("g2", second))
    run(admin.grant_publisher("g1", CONFIG, "pub", "pw"))
    run(admin.grant_publisher("g2", second, "pub", None))
    run(admin.grant_publisher("g2", second, "pub", None))
    exceptions = server.names(VPN, "aclProfiles", "pub", "publishTopicExceptions")
    assert exceptions == sorted([*PUBLISHER_EXCEPTIONS, "smf,_lbg/g2/summary", "smf,pay/>"])
    run(admin.revoke_publisher("g2", second, "pub"))
    assert server.names(VPN, "aclProfiles", "pub", "publishTopicExceptions") == (
        PUBLISHER_EXCEPTIONS
    )
    assert server.names(VPN, "clientUsernames") == ["cu1", "lbg-client", "pub"]
    with pytest.raises(BrokerError, match="user 'pub' is not a publisher of group 'g2'"):
        run(admin.revoke_publisher("g2", second, "pub"))
    run(admin.revoke_publisher("g1", CONFIG, "pub"))
    assert server.names(VPN, "clientUsernames") == ["cu1", "lbg-client"]
    assert server.names(VPN, "aclProfiles") == ["cu1", "lbg-client"]
    assert server.names(VPN, "clientProfiles") == ["cu1", "lbg-client"]
    for request in server.requests:
        check_request(request)


@pytest.mark.parametrize(
    ("user", "password", "prepare", "refusal"),
    [
        ("cu1", "pw", None, "'cu1' is the client username \\(CU\\) of group 'g1'"),
        ("pub", None, None, "publisher username 'pub' does not exist: give a password"),
        ("pub", "pw", "clientProfiles", "client profile 'pub' already exists"),
        ("pub", "pw", "clientUsernames", "client username 'pub' already exists with ACL"),
    ],
)
def test_grant_publisher_refuses_a_clash_and_creates_nothing(
    server: SempServer,
    admin: Provisioner,
    user: str,
    password: str | None,
    prepare: str | None,
    refusal: str,
) -> None:
    run(admin.create_group("g1", CONFIG))
    if prepare is not None:
        body = {IDENTIFIERS[prepare][0]: user}
        run(admin.semp.create(f"/msgVpns/{VPN}/{prepare}", body))
    before = dict(server.objects)
    with pytest.raises(BrokerError, match=refusal):
        run(admin.grant_publisher("g1", CONFIG, user, password))
    assert server.objects == before


@pytest.mark.parametrize("adopt", [False, True])
def test_a_grant_failing_part_way_undoes_what_it_created(
    server: SempServer, admin: Provisioner, adopt: bool
) -> None:
    second = GroupConfig(hash_prefix="pay", hash_count=4, queue_count=2)
    run(admin.create_group("g1", CONFIG))
    run(admin.create_group("g2", second))
    if adopt:
        run(admin.grant_publisher("g2", second, "pub", "pw"))
    before = dict(server.objects)
    server.fail("POST", lambda path: path.endswith("/publishTopicExceptions"), skip=1)
    with pytest.raises(BrokerError, match=r"cannot grant 'pub' publishing to 'g1': .*injected"):
        run(admin.grant_publisher("g1", CONFIG, "pub", "pw"))
    assert server.objects == before
    assert sum(r.method == "DELETE" for r in server.requests) == (1 if adopt else 3)


def test_brokers_keeping_users_elsewhere_say_how_to_make_a_publisher() -> None:
    broker = NatsBroker.__new__(NatsBroker)
    with pytest.raises(BrokerError, match="NATS users live in the server config: render"):
        run(broker.grant_publisher("g1", CONFIG, "pub", "pw"))
    with pytest.raises(BrokerError, match=r"python -m lbg\.broker\.nats\.permissions"):
        run(broker.revoke_publisher("g1", CONFIG, "pub"))
