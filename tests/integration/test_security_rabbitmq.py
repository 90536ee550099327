"""RabbitMQ over amqps:// with a throwaway CA: cg-admin and the broker interface work over TLS
when they trust the CA, and fail with one clear line when they do not."""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import aiormq.exceptions
import orjson
import pytest
from tests.support.parking_probe import park_and_unpark
from tests.support.tls import Pki, make_pki

from lbg.broker import connect_broker
from lbg.broker.base import BrokerError, PublishError
from lbg.broker.rabbitmq.management import ManagementApi
from lbg.devstack.deployment import script
from lbg.devstack.embedded import free_port
from lbg.devstack.rabbitmq import PASSWORD, USER, LocalRabbitMQ
from lbg.model.destinations import OutputKind, event_destination, output_destination
from lbg.settings import BrokerSettings

pytestmark = pytest.mark.skipif(
    "rabbitmq" not in os.environ.get("LBG_TEST_BROKERS", "nats,rabbitmq"),
    reason="RabbitMQ is not among LBG_TEST_BROKERS",
)


MAX_MESSAGE_SIZE = 1024 * 1024


class TlsRabbitMQ(LocalRabbitMQ):
    """The private node with an extra TLS listener using the test CA's server certificate,
    and a 1 MB message size limit that an oversized event can exceed cheaply."""

    def __init__(self, data_dir: Path, pki: Pki) -> None:
        super().__init__(data_dir)
        self.pki = pki
        self.tls_port = free_port()

    @property
    def tls_url(self) -> str:
        return f"amqps://{USER}:{PASSWORD}@127.0.0.1:{self.tls_port}/%2F"

    def _write_config(self) -> None:
        super()._write_config()
        with (self.data_dir / "rabbitmq.conf").open("a", encoding="utf-8") as conf:
            conf.write(
                f"listeners.ssl.1 = 127.0.0.1:{self.tls_port}\n"
                f"ssl_options.cacertfile = {self.pki.ca}\n"
                f"ssl_options.certfile = {self.pki.server_cert}\n"
                f"ssl_options.keyfile = {self.pki.server_key}\n"
                "ssl_options.verify = verify_none\n"
                "ssl_options.fail_if_no_peer_cert = false\n"
                f"max_message_size = {MAX_MESSAGE_SIZE}\n"
            )


@pytest.fixture(scope="module")
def tls_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsRabbitMQ]:
    base = tmp_path_factory.mktemp("tls-rabbitmq")
    node = TlsRabbitMQ(base / "node", make_pki(base / "pki"))
    node.start()
    yield node
    node.stop()


def cg_admin(node: TlsRabbitMQ, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [script("cg-admin"), "--config", str(config), "--admin-url", node.admin_url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def broker_config(tmp_path: Path, node: TlsRabbitMQ, ca: bool) -> Path:
    path = tmp_path / f"admin-{int(ca)}.toml"
    lines = ["[broker]", f'url = "{node.tls_url}"', "connect_timeout = 3.0"]
    if ca:
        lines.append(f'tls_ca_file = "{node.pki.ca}"')
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


async def round_trip(settings: BrokerSettings, group: str) -> int:
    """Publish one output record over TLS and read it back; how many came back."""
    broker = await connect_broker(settings, "tls-probe")
    try:
        await broker.read_group(group)
        await broker.publish(output_destination(group, OutputKind.VALIDATION), b"{}")
        async for _message in broker.read_output(group):
            return 1
    finally:
        await broker.close()
    return 0


def test_cg_admin_and_the_broker_work_over_amqps(tls_rabbitmq: TlsRabbitMQ, tmp_path: Path) -> None:
    group = f"t{uuid.uuid4().hex[:8]}"
    config = broker_config(tmp_path, tls_rabbitmq, ca=True)
    created = cg_admin(tls_rabbitmq, config, "create", "--group", group, "--hash-prefix", group)
    assert created.returncode == 0, created.stderr
    try:
        settings = BrokerSettings(url=tls_rabbitmq.tls_url, tls_ca_file=str(tls_rabbitmq.pki.ca))
        assert asyncio.run(asyncio.wait_for(round_trip(settings, group), 30)) == 1
    finally:
        assert cg_admin(tls_rabbitmq, config, "delete", group).returncode == 0


def test_amqps_without_the_ca_fails_with_one_line(
    tls_rabbitmq: TlsRabbitMQ, tmp_path: Path
) -> None:
    result = cg_admin(tls_rabbitmq, broker_config(tmp_path, tls_rabbitmq, ca=False), "list")
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "CERTIFICATE_VERIFY_FAILED" in result.stderr
    assert f"amqps://{USER}@127.0.0.1:{tls_rabbitmq.tls_port}" in result.stderr


def test_the_connection_error_names_the_url_without_its_password() -> None:
    secret = uuid.uuid4().hex
    settings = BrokerSettings(
        url=f"amqps://lbg:{secret}@127.0.0.1:{free_port()}/", connect_timeout=1
    )
    with pytest.raises(BrokerError) as caught:
        asyncio.run(connect_broker(settings, "x"))
    assert secret not in str(caught.value)
    assert re.search(r"cannot connect to amqps://lbg(:\*+)?@127\.0\.0\.1:", str(caught.value))


def test_an_oversized_event_is_refused_as_bad_input_and_counted(
    tls_rabbitmq: TlsRabbitMQ, tmp_path: Path
) -> None:
    """A 2 MB line (over the node's max_message_size) is one warning and one rejected input,
    and the run exits 1; the events around it are still published."""
    group = f"b{uuid.uuid4().hex[:8]}"
    config = broker_config(tmp_path, tls_rabbitmq, ca=True)
    created = cg_admin(tls_rabbitmq, config, "create", "--group", group, "--hash-prefix", group)
    assert created.returncode == 0, created.stderr
    events = tmp_path / "events.jsonl"
    lines = [{"key": "a", "data": 1}, {"key": "huge", "body": "x" * 2_000_000}, {"key": "b"}]
    events.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    try:
        result = subprocess.run(
            [
                script("hashed-publisher"),
                "--config",
                str(config),
                "--group",
                group,
                "--input",
                str(events),
                "--no-summary",
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
    finally:
        assert cg_admin(tls_rabbitmq, config, "delete", group).returncode == 0
    assert result.returncode == 1, result.stderr
    stats = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert (stats["acked"], stats["rejected_input"]) == (2, 1)
    refused = [line for line in result.stderr.splitlines() if "'huge'" in line]
    assert len(refused) == 1, result.stderr
    assert f"is larger than configured max size {MAX_MESSAGE_SIZE}" in refused[0]
    assert "Traceback" not in result.stderr


SECRET = f"leak-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    "flags",
    [
        ("--admin-url", "http://adm:{secret}@127.0.0.1:{closed}"),
        ("--admin-url", "http://adm:{secret}@127.0.0.1:{management}"),
        ("--admin-url", "ftp://adm:{secret}@127.0.0.1:{management}"),
        ("--broker-url", "bogus://lbg:{secret}@127.0.0.1:{tls}"),
        ("--broker-url", "amqps://lbg:{secret}@127.0.0.1:{tls}"),
        ("--broker-url", "amqps://lbg:{secret}@127.0.0.1:{closed}"),
    ],
    ids=["admin-unreachable", "admin-refused", "admin-scheme", "scheme", "refused", "unreachable"],
)
def test_no_error_shows_a_password(
    tls_rabbitmq: TlsRabbitMQ, tmp_path: Path, flags: tuple[str, str]
) -> None:
    """Each way cg-admin can fail with a password in a URL: one line, the password masked."""
    option, template = flags
    value = template.format(
        secret=SECRET,
        closed=free_port(),
        management=tls_rabbitmq.admin_url.rsplit(":", 1)[1],
        tls=tls_rabbitmq.tls_port,
    )
    result = subprocess.run(
        [
            script("cg-admin"),
            "--config",
            str(broker_config(tmp_path, tls_rabbitmq, ca=True)),
            option,
            value,
            "list",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert SECRET not in result.stderr + result.stdout


async def user_state(node: TlsRabbitMQ, user: str, change: dict | None = None) -> dict:
    """The user's tags and permissions (after creating it as `change` says, if given)."""
    api = ManagementApi(node.admin_url, USER, PASSWORD)
    try:
        if change is not None:
            await api.put(f"/users/{user}", {"password": uuid.uuid4().hex, "tags": change["tags"]})
            await api.put(f"/permissions/%2F/{user}", change["permissions"])
        record = await api.get(f"/users/{user}")
        return {
            "tags": record["tags"],
            "permissions": await api.get(f"/users/{user}/permissions"),
            "topic": await api.get(f"/users/{user}/topic-permissions"),
        }
    finally:
        await api.close()


def test_cg_admin_never_takes_over_a_user_it_did_not_create(
    tls_rabbitmq: TlsRabbitMQ, tmp_path: Path
) -> None:
    """An existing administrator named as publisher or CU is refused, and keeps its tags and
    permissions; with --force it is granted, and revoking deletes only what cg-admin wrote."""
    group, boss = f"u{uuid.uuid4().hex[:8]}", f"boss{uuid.uuid4().hex[:8]}"
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    before = asyncio.run(
        user_state(tls_rabbitmq, boss, {"tags": "administrator", "permissions": everything})
    )
    config = broker_config(tmp_path, tls_rabbitmq, ca=True)
    created = cg_admin(tls_rabbitmq, config, "create", "--group", group, "--hash-prefix", group)
    assert created.returncode == 0, created.stderr
    try:
        granted = cg_admin(tls_rabbitmq, config, "grant-publisher", group, "--user", boss)
        as_cu = cg_admin(
            tls_rabbitmq,
            config,
            "create",
            "--group",
            f"{group}x",
            "--hash-prefix",
            f"{group}x",
            "--client-username",
            boss,
        )
        after = asyncio.run(user_state(tls_rabbitmq, boss))
        forced = cg_admin(tls_rabbitmq, config, "grant-publisher", group, "--user", boss, "--force")
        revoked = cg_admin(tls_rabbitmq, config, "revoke-publisher", group, "--user", boss)
        left = asyncio.run(user_state(tls_rabbitmq, boss))
        listed = cg_admin(tls_rabbitmq, config, "list")
    finally:
        assert cg_admin(tls_rabbitmq, config, "delete", group).returncode == 0
    for refused in (granted, as_cu):
        assert refused.returncode == 1
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert f"user '{boss}' exists and has tags ['administrator']" in refused.stderr
        assert "--force" in refused.stderr
    assert after == before
    assert f"{group}x" not in listed.stdout
    assert (forced.returncode, revoked.returncode) == (0, 0), forced.stderr + revoked.stderr
    assert left == {"tags": ["administrator"], "permissions": [], "topic": []}


async def hostile_identities(node: TlsRabbitMQ, group: str, cu: str, pub: str) -> dict[str, str]:
    """What the group's CU and publisher try beyond their job, and what became of it."""
    outcome: dict[str, str] = {}
    url = node.tls_url.replace(f"{USER}:{PASSWORD}@", "")
    ca = str(node.pki.ca)
    client = await connect_broker(
        BrokerSettings(url=url, user=cu, password=cu, tls_ca_file=ca), "cu"
    )
    try:
        try:
            await client.publish(output_destination(group, OutputKind.SUMMARY), b"{}")
            outcome["fake summary"] = "allowed"
        except PublishError as exc:
            outcome["fake summary"] = str(exc)
        outcome["park"] = await park_and_unpark(client, group)
    finally:
        await client.close()
    context = ssl.create_default_context(cafile=ca)
    for name in ("", f"lbg.{group}.member.{uuid.uuid4().hex}"):
        connection = await aio_pika.connect(
            url.replace("amqps://", f"amqps://{cu}:{cu}@"), ssl_context=context
        )
        try:
            channel = await connection.channel()
            declared = await channel.declare_queue(name, durable=True)
            outcome[name or "server-named"] = declared.name
        except aiormq.exceptions.ChannelAccessRefused as exc:
            outcome[name or "server-named"] = str(exc)
        finally:
            await connection.close()
    publisher = await connect_broker(
        BrokerSettings(url=url, user=pub, password=pub, tls_ca_file=ca), "pub"
    )
    try:
        config = await publisher.read_group(group)
        try:
            await publisher.publish(event_destination(config.hash_prefix, 99999, "k"), b"{}")
            outcome["bucket 99999"] = "allowed"
        except PublishError as exc:
            outcome["bucket 99999"] = str(exc)
        try:
            await publisher.parking(group).records()
            outcome["publisher parked keys"] = "allowed"
        except BrokerError as exc:
            outcome["publisher parked keys"] = str(exc)
    finally:
        await publisher.close()
    return outcome


async def queue_policy(node: TlsRabbitMQ, name: str) -> dict:
    api = ManagementApi(node.admin_url, USER, PASSWORD)
    try:
        for _ in range(50):
            info = await api.get(f"/queues/%2F/{name}")
            if info.get("effective_policy_definition"):
                return info["effective_policy_definition"]
            await asyncio.sleep(0.2)
        return {}
    finally:
        await api.close()


def test_the_cu_and_publisher_cannot_act_beyond_their_job(
    tls_rabbitmq: TlsRabbitMQ, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CU cannot fake a publisher summary nor declare a server-named (amq.gen-) queue;
    a durable member queue it declares instead expires under cg-admin's policy; the
    publisher cannot publish to a bucket outside HC."""
    suffix = uuid.uuid4().hex[:8]
    group, cu, pub = f"h{suffix}", f"cu{suffix}", f"pub{suffix}"
    monkeypatch.setenv("LBG_CLIENT_PASSWORD", cu)
    monkeypatch.setenv("LBG_PUBLISHER_PASSWORD", pub)
    config = broker_config(tmp_path, tls_rabbitmq, ca=True)
    created = cg_admin(
        tls_rabbitmq, config, "create", "--group", group, "--hash-prefix", group,
        "--hash-count", "8", "--client-username", cu,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    try:
        granted = cg_admin(tls_rabbitmq, config, "grant-publisher", group, "--user", pub)
        assert granted.returncode == 0, granted.stderr
        outcome = asyncio.run(hostile_identities(tls_rabbitmq, group, cu, pub))
        member = next(name for name in outcome if ".member." in name)
        policy = asyncio.run(queue_policy(tls_rabbitmq, member))
        cg_admin(tls_rabbitmq, config, "revoke-publisher", group, "--user", pub)
    finally:
        assert cg_admin(tls_rabbitmq, config, "delete", group).returncode == 0
    assert "ACCESS_REFUSED" in outcome["fake summary"]
    assert "ACCESS_REFUSED" in outcome["server-named"]
    assert outcome[member] == member
    assert policy == {"expires": 60000, "max-length": 1000}
    assert "ACCESS_REFUSED" in outcome["bucket 99999"]
    assert outcome["park"] == "ok"
    refused = f"group '{group}': not allowed to read its parking stream"
    assert outcome["publisher parked keys"] == refused


def test_a_cu_taken_over_with_force_serves_further_groups_without_it(
    tls_rabbitmq: TlsRabbitMQ, tmp_path: Path
) -> None:
    """An untagged existing user is refused as CU, taken over with --force, and then simply
    gets each further group: its permissions are the ones cg-admin wrote."""
    suffix = uuid.uuid4().hex[:8]
    first, second, user = f"f{suffix}", f"s{suffix}", f"ext{suffix}"
    asyncio.run(user_state(tls_rabbitmq, user, {"tags": "", "permissions": {
        "configure": "^$", "write": "^$", "read": "^$"}}))  # fmt: skip
    config = broker_config(tmp_path, tls_rabbitmq, ca=True)

    def create(group: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return cg_admin(
            tls_rabbitmq, config, "create", "--group", group, "--hash-prefix", group,
            "--client-username", user, *extra,
        )  # fmt: skip

    refused = create(first)
    forced = create(first, "--force")
    further = create(second)
    try:
        assert refused.returncode == 1
        assert f"user '{user}' exists and has no 'lbg-client' tag" in refused.stderr
        assert forced.returncode == 0, forced.stderr
        assert further.returncode == 0, further.stderr
    finally:
        for group in (first, second):
            cg_admin(tls_rabbitmq, config, "delete", group)
