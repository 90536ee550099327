"""NATS with TLS required and least-privilege users: the daemons work end to end over TLS, each
identity with only its group's permissions; what is not allowed fails with one clear line."""

from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import nats.js.errors
import orjson
import pytest
from tests.support.parking_probe import park_and_unpark
from tests.support.processes import wait_for_log
from tests.support.tls import Pki, make_pki

from lbg.broker import connect_broker
from lbg.broker.base import BrokerError, GroupNotFound, PublishError
from lbg.broker.nats.adapter import CONFIG_BUCKET, events_stream
from lbg.broker.nats.connection import ConnectionLog, connect_nats
from lbg.broker.nats.unpins import taken_consumers
from lbg.devstack.deployment import LocalDeployment, script
from lbg.devstack.embedded import EmbeddedNats, free_port
from lbg.model.destinations import OutputKind, event_destination, output_destination
from lbg.model.parking import parked
from lbg.settings import PASSWORD_ENV, BrokerSettings

PASSWORDS = {
    "LBG_NATS_ADMIN_PASSWORD": f"adm-{uuid.uuid4().hex}",
    "LBG_NATS_PUBLISHER_PASSWORD": f"pub-{uuid.uuid4().hex}",
    "LBG_NATS_CLIENT_PASSWORD": f"cli-{uuid.uuid4().hex}",
}
ROLES = {
    "admin": ("lbg-admin", "LBG_NATS_ADMIN_PASSWORD"),
    "publisher": ("lbg-publisher", "LBG_NATS_PUBLISHER_PASSWORD"),
    "client": ("lbg-client", "LBG_NATS_CLIENT_PASSWORD"),
}


@dataclass(frozen=True)
class SecureNats:
    """A TLS-only nats-server whose users may each touch only `group` (and `other`, admin)."""

    url: str
    pki: Pki
    group: str
    other: str
    workdir: Path

    def settings(self, role: str, **changes: object) -> BrokerSettings:
        user, variable = ROLES[role]
        values: dict[str, object] = {
            "url": self.url,
            "user": user,
            "password": PASSWORDS[variable],
            "tls_ca_file": str(self.pki.ca),
            "connect_timeout": 3.0,
        }
        return BrokerSettings(**(values | changes))  # type: ignore[arg-type]

    def config_file(self, role: str, ca: bool = True, password_file: bool = True) -> Path:
        """A daemon config for `role`: user, the test CA and (unless the password is to come
        from $LBG_BROKER_PASSWORD) a password file."""
        user, variable = ROLES[role]
        secret = self.workdir / f"{role}.password"
        secret.write_text(PASSWORDS[variable] + "\n", encoding="utf-8")
        path = (
            self.workdir / f"{role}{'' if ca else '-no-ca'}{'' if password_file else '-env'}.toml"
        )
        lines = ["[broker]", f'user = "{user}"', "connect_timeout = 3.0"]
        if password_file:
            lines.append(f'password_file = "{secret}"')
        if ca:
            lines.append(f'tls_ca_file = "{self.pki.ca}"')
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path

    def admin(self, *args: str, config: Path | None = None, url: str | None = None):
        """cg-admin as the admin user (or with the given config), to completion."""
        return subprocess.run(
            [
                script("cg-admin"),
                "--config",
                str(config or self.config_file("admin")),
                "--broker-url",
                url or self.url,
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )


@pytest.fixture(scope="module")
def secure_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureNats]:
    """The server, with two groups created by the admin: the users' own and another one."""
    base = tmp_path_factory.mktemp("secure-nats")
    pki = make_pki(base / "pki")
    group, other = f"s{uuid.uuid4().hex[:8]}", f"o{uuid.uuid4().hex[:8]}"
    users = subprocess.run(
        [
            sys.executable,
            "-m",
            "lbg.broker.nats.permissions",
            "--group",
            group,
            "--hash-prefix",
            group,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    conf = base / "server.conf"
    conf.write_text(
        f'tls {{\n  cert_file: "{pki.server_cert}"\n  key_file: "{pki.server_key}"\n}}\n{users}',
        encoding="utf-8",
    )
    saved = {name: os.environ.get(name) for name in PASSWORDS}
    os.environ.update(PASSWORDS)
    server = EmbeddedNats(base / "data", extra_args=("-c", str(conf)), scheme="tls")
    try:
        server.start()
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    secure = SecureNats(server.url, pki, group, other, base)
    for name in (group, other):
        created = secure.admin(
            "create", "--group", name, "--hash-prefix", name, "--hash-count", "8"
        )
        assert created.returncode == 0, created.stderr
    yield secure
    server.stop()


def test_the_daemons_work_over_tls_each_with_least_privilege_and_never_log_secrets(
    secure_nats: SecureNats, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients read their password from a file, the publisher from $LBG_BROKER_PASSWORD;
    no password shows up in any log (even at debug level) or in the stored group config; the
    clients follow a resize under load with their least-privilege user."""
    monkeypatch.setenv(PASSWORD_ENV, PASSWORDS["LBG_NATS_PUBLISHER_PASSWORD"])
    deployment = LocalDeployment(secure_nats.url, secure_nats.group, tmp_path)
    client_config = str(secure_nats.config_file("client"))
    try:
        for index in range(2):
            deployment.start_client(
                f"client-{index}", index, 2, 60, "--config", client_config, "-vv"
            )
        publisher = deployment.start_publisher(
            "pub",
            "--config",
            str(secure_nats.config_file("publisher", password_file=False)),
            "-vv",
            "--keys",
            "30",
            "--count",
            "1500",
            "--rate",
            "300",
        )
        wait_for_log(publisher, "-> group")
        time.sleep(1)
        # The clients follow a resize with nothing but their own user's permissions.
        resized = secure_nats.admin("resize", secure_nats.group, "--queues", "2")
        assert resized.returncode == 0 and "-> 2" in resized.stdout, resized.stderr
        assert publisher.wait(60) == 0, publisher.log_tail()
        report_path = tmp_path / "report.json"
        validator = deployment.start(
            "validator",
            "validation-client",
            "--config",
            str(secure_nats.config_file("admin")),
            "--idle-exit",
            "2",
            "--progress-interval",
            "0",
            "--report-json",
            str(report_path),
        )
        assert validator.wait(90) == 0, validator.log_tail()
    finally:
        deployment.stop_all()
    report = orjson.loads(report_path.read_bytes())
    assert (report["published"], report["unique"], report["lost"]) == (1500, 1500, 0)
    assert report["reordered"] == 0
    stored = secure_nats.admin("list", "--json")
    assert secure_nats.group in stored.stdout
    for text in [stored.stdout, *(d.log_path.read_text() for d in deployment.daemons.values())]:
        assert "not permitted" not in text
        for secret in PASSWORDS.values():
            assert secret not in text


def test_a_password_in_the_url_is_masked_in_errors(secure_nats: SecureNats) -> None:
    secret = PASSWORDS["LBG_NATS_ADMIN_PASSWORD"]
    url = f"tls://lbg-admin:{secret}@127.0.0.1:{free_port()}"
    result = secure_nats.admin("list", url=url)
    assert result.returncode == 1
    assert "cannot connect to tls://lbg-admin:***@127.0.0.1:" in result.stderr
    assert secret not in result.stderr + result.stdout


@pytest.mark.parametrize("scheme", ["tls", "nats"])
def test_a_client_without_the_ca_fails_with_one_line(secure_nats: SecureNats, scheme: str) -> None:
    url = secure_nats.url.replace("tls://", f"{scheme}://")
    result = secure_nats.admin("list", config=secure_nats.config_file("admin", ca=False), url=url)
    assert result.returncode != 0
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "certificate is not trusted; set [broker] tls_ca_file" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_ca_file_is_named_in_one_line(secure_nats: SecureNats, tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'[broker]\ntls_ca_file = "{tmp_path / "nope.pem"}"\n', encoding="utf-8")
    result = secure_nats.admin("list", config=config)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    # A long value is shortened in the message: check the key and the path's beginning.
    shown = f'[broker] tls_ca_file: no such file "{str(tmp_path / "nope.pem")[:40]}'
    assert shown in result.stderr, result.stderr


async def client_attempts(secure: SecureNats) -> dict[str, str]:
    """What the client user may do: its own queue, and then what it must not."""
    outcome: dict[str, str] = {}
    broker = await connect_broker(secure.settings("client"), "client-probe")
    try:
        config = await broker.read_group(secure.group)
        binding = await broker.bind(secure.group, config, 0, "probe")
        await binding.close()
        await broker.publish(output_destination(secure.group, OutputKind.VALIDATION), b"{}")
        outcome["own"] = "ok"
        outcome["park"] = await park_and_unpark(broker, secure.group)
        try:
            await broker.parking(secure.other).put("k", parked("k", "probe", 1, "probe").to_json())
            outcome["park other"] = "allowed"
        except BrokerError as exc:
            outcome["park other"] = str(exc)
        try:
            await broker.publish(event_destination(secure.group, 0, "k"), b"{}")
            outcome["publish event"] = "allowed"
        except PublishError as exc:
            outcome["publish event"] = str(exc)
        try:
            await broker.bind(secure.other, config, 0, "probe")
            outcome["bind other"] = "allowed"
        except BrokerError as exc:
            outcome["bind other"] = str(exc)
        try:
            await broker.read_group(secure.other)
            outcome["read other"] = "allowed"
        except BrokerError as exc:
            outcome["read other"] = str(exc)
    finally:
        await broker.close()
    return outcome


async def consumer_listings(secure: SecureNats) -> dict[str, str]:
    """The client user lists the consumers of its group's stream (the standbys' shared look),
    then those of another group's, as a hostile user with the client's account would."""
    events = ConnectionLog()
    nc = await connect_nats(secure.settings("client"), "lister", events)
    outcome: dict[str, str] = {}
    try:
        for name, group in (("own", secure.group), ("other", secure.other)):
            try:
                taken = await taken_consumers(nc, events_stream(group))
                outcome[name] = f"listed, {len(taken)} taken"
            except Exception as exc:  # a refused request gets no answer: a timeout
                subject = f"$JS.API.CONSUMER.LIST.{events_stream(group)}"
                outcome[name] = events.refusal(subject) or repr(exc)
    finally:
        await nc.close()
    return outcome


def test_the_client_user_lists_its_own_groups_consumers_only(secure_nats: SecureNats) -> None:
    outcome = asyncio.run(consumer_listings(secure_nats))
    assert outcome["own"].startswith("listed")
    assert outcome["other"] == (
        "not permitted: the server refused this user publishing to"
        f" '$JS.API.CONSUMER.LIST.LBG_{secure_nats.other}'"
    )


def test_the_client_user_reaches_its_own_group_only(secure_nats: SecureNats) -> None:
    outcome = asyncio.run(client_attempts(secure_nats))
    group, other = secure_nats.group, secure_nats.other
    assert outcome["own"] == "ok"
    assert outcome["park"] == "ok"
    refused = "not permitted: the server refused this user publishing to"
    assert outcome["park other"] == (
        f"group '{other}': parked keys: {refused} '$JS.API.STREAM.INFO.KV_lbg_parked_{other}'"
    )
    assert outcome["publish event"] == f"{refused} '{group}.0.k'"
    # q0, or g1q0 once the daemons' test above has resized the group whose config it passes.
    assert outcome["bind other"].startswith(
        f"group '{other}' queue 0: {refused} '$JS.API.CONSUMER.INFO.LBG_{other}."
    )
    assert outcome["read other"].startswith(f"group '{other}': cannot read its config ({refused}")


async def publisher_attempts(secure: SecureNats) -> dict[str, str]:
    """The publisher user publishes its group's events but may not consume them, nor publish
    to another group or outside its buckets."""
    outcome: dict[str, str] = {}
    broker = await connect_broker(secure.settings("publisher"), "publisher-probe")
    try:
        config = await broker.read_group(secure.group)
        await broker.publish(event_destination(config.hash_prefix, 0, "k"), b"{}")
        outcome["publish"] = "ok"
        try:
            await broker.bind(secure.group, config, 0, "probe")
            outcome["bind"] = "allowed"
        except BrokerError as exc:
            outcome["bind"] = str(exc)
        try:
            await broker.publish(event_destination(secure.other, 0, "k"), b"{}")
            outcome["publish other"] = "allowed"
        except PublishError as exc:
            outcome["publish other"] = str(exc)
        try:
            await broker.publish(event_destination(config.hash_prefix, 99999, "k"), b"{}")
            outcome["bucket 99999"] = "allowed"
        except PublishError as exc:
            outcome["bucket 99999"] = str(exc)
    finally:
        await broker.close()
    return outcome


def test_the_publisher_user_publishes_but_cannot_consume(secure_nats: SecureNats) -> None:
    outcome = asyncio.run(publisher_attempts(secure_nats))
    assert outcome["publish"] == "ok"
    assert "not permitted" in outcome["bind"]
    assert "not permitted" in outcome["publish other"]
    # The events stream takes the group's buckets only: one outside HC is refused, not lost.
    assert outcome["bucket 99999"].startswith(f"no stream captures '{secure_nats.group}.99999.k'")


async def read_on_a_fresh_server(url: str) -> tuple[str, bool]:
    """Read a group where none was ever created: the error, and whether the bucket appeared."""
    broker = await connect_broker(BrokerSettings(url=url), "reader")
    try:
        with pytest.raises(GroupNotFound) as caught:
            await broker.read_group("nothing")
    finally:
        await broker.close()
    nc = await nats.connect(url)
    try:
        await nc.jetstream().stream_info(f"KV_{CONFIG_BUCKET}")
        created = True
    except nats.js.errors.NotFoundError:
        created = False
    finally:
        await nc.close()
    return str(caught.value), created


def test_reading_a_group_never_creates_the_config_bucket(tmp_path: Path) -> None:
    """So a client user, who may not create streams, is told the group does not exist yet."""
    with EmbeddedNats(tmp_path / "fresh") as url:
        message, created = asyncio.run(read_on_a_fresh_server(url))
    assert message == "group 'nothing' does not exist (no config in KV)"
    assert not created


@pytest.mark.parametrize("scheme", ["tls", "nats-with-ca"])
def test_asking_for_tls_never_falls_back_to_plain_text(
    tmp_path: Path, scheme: str, secure_nats: SecureNats
) -> None:
    """nats-py would talk plain text to a server without TLS even for tls://: refused."""
    with EmbeddedNats(tmp_path / "plain") as url:
        if scheme == "tls":
            settings = BrokerSettings(url=url.replace("nats://", "tls://"))
        else:
            settings = BrokerSettings(url=url, tls_ca_file=str(secure_nats.pki.ca))
        with pytest.raises(BrokerError) as caught:
            asyncio.run(connect_broker(settings, "downgrade-probe"))
    assert str(caught.value) == (
        f"{settings.url}: the server does not require TLS, and TLS was asked for"
        " (tls:// or a tls_* key): refusing to talk to it in plain text"
    )


async def drain_queues(bindings: list, want: int, within: float) -> int:
    """Take and ack deliveries from every binding until `want` arrived or time is up."""
    received = 0

    async def take(binding) -> None:
        nonlocal received
        while True:
            delivery = await binding.next()
            await binding.ack(delivery)
            received += 1

    tasks = [asyncio.create_task(take(binding)) for binding in bindings]
    deadline = asyncio.get_running_loop().time() + within
    while received < want and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return received


async def inbox_spying(secure: SecureNats) -> tuple[dict[str, list[str]], dict[str, str], int]:
    """The group's publisher and client users each subscribe to every inbox while the client
    pulls the publisher's events: what each spy received, the server's refusals, and how
    many events the client got."""
    seen: dict[str, list[str]] = {}
    refusals: dict[str, str] = {}
    spies = []
    for role in ("publisher", "client"):
        user, variable = ROLES[role]
        seen[role] = []

        async def spy(msg, role: str = role) -> None:
            seen[role].append(msg.subject)

        async def refused(exc: Exception, role: str = role) -> None:
            refusals[role] = str(exc)

        nc = await nats.connect(
            secure.url,
            user=user,
            password=PASSWORDS[variable],
            tls=ssl.create_default_context(cafile=str(secure.pki.ca)),
            error_cb=refused,
        )
        await nc.subscribe("_INBOX.>", cb=spy)
        await nc.flush()
        spies.append(nc)
    publisher = await connect_broker(secure.settings("publisher"), "victim-publisher")
    client = await connect_broker(secure.settings("client"), "victim-client")
    try:
        config = await client.read_group(secure.group)
        bindings = [
            await client.bind(secure.group, config, queue, "victim")
            for queue in range(config.queue_count)
        ]
        for index in range(20):
            key = f"secret-{index}"
            destination = event_destination(config.hash_prefix, config.bucket_for_key(key), key)
            await publisher.publish(destination, b"confidential")
        received = await drain_queues(bindings, 20, 30.0)
        for binding in bindings:
            await binding.close()
    finally:
        await client.close()
        await publisher.close()
        for nc in spies:
            await nc.close()
    return seen, refusals, received


def test_no_user_can_read_another_users_replies(secure_nats: SecureNats) -> None:
    """Pulled events, publish acks and API answers go to each user's own inbox prefix: a
    subscription to every inbox is refused, and a spy sees nothing of the others' traffic."""
    seen, refusals, received = asyncio.run(inbox_spying(secure_nats))
    assert received >= 20
    assert seen == {"publisher": [], "client": []}
    for role in ("publisher", "client"):
        assert 'permissions violation for subscription to "_inbox.>"' in refusals[role].lower()


def test_an_oversized_event_is_refused_as_bad_input_and_counted(
    secure_nats: SecureNats, tmp_path: Path
) -> None:
    """A 2 MB line (over the server's 1 MB max_payload) is one warning and one rejected input,
    and the run exits 1; the events around it are still published."""
    events = tmp_path / "events.jsonl"
    lines = [{"key": "a", "data": 1}, {"key": "huge", "body": "x" * 2_000_000}, {"key": "b"}]
    events.write_bytes(b"\n".join(orjson.dumps(line) for line in lines) + b"\n")
    result = subprocess.run(
        [
            script("hashed-publisher"),
            "--config",
            str(secure_nats.config_file("publisher")),
            "--broker-url",
            secure_nats.url,
            "--group",
            secure_nats.group,
            "--input",
            str(events),
            "--no-summary",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1, result.stderr
    stats = orjson.loads(result.stdout.strip().splitlines()[-1])
    assert (stats["acked"], stats["rejected_input"]) == (2, 1)
    refused = [line for line in result.stderr.splitlines() if "'huge'" in line]
    assert len(refused) == 1, result.stderr
    assert "exceeds the server's max_payload of 1048576 bytes" in refused[0]
    assert "Traceback" not in result.stderr and "never retrieved" not in result.stderr
