"""cg-admin's flows on Solace, over SEMP v2 as the original CGadmin did: create, list, read, delete.

Objects of group `<g>` in the Message VPN (names chosen here, documented for operators):
- `lbg.<g>.q<N>`, N = 0..QC-1: the group's queues. Exclusive (non-exclusive when EX=0),
  owner CU and `no-access` for every other username (as the original CGadmin), QS MB of
  spool, ingress and egress enabled; queue N is subscribed to `<HP>/<b>/>` for each of its
  buckets b = N, N+QC, N+2*QC, ... < HC.
- `lbg.<g>.out`: the output queue, non-exclusive and `read-only` for others, subscribed to
  `_lbg/<g>/>`; it keeps the validation, dead-letter and summary outputs to be browsed.
- `lbg.<g>.owners`: the ownership claims (claims.py), non-exclusive, owner CU and `no-access`
  for others, subscribed to `_lbgctl/<g>/owners/>`; claims expire after CLAIM_TTL_SECONDS.
  The CU publishes them under the `_lbgctl/<g>/>` exception it has for heartbeats, so it
  may claim for its own groups only. `cg-admin upgrade` adds it to a group made before it.
- JNDI queue object `lbg/<g>`: its physicalName is the group JSON (at most 200 characters).
  It is the group's record: created last and deleted last, so `list` (every JNDI queue named
  `lbg/...`) only shows complete groups and a half-deleted group can be deleted again.
- Client username CU, with a client profile and an ACL profile both named CU: connect
  allowed, publish and subscribe denied except, per group it serves, publishing to
  `_lbg/<g>/>` (outputs) and `_lbgctl/<g>/>` and subscribing to `_lbgctl/<g>/>` (membership
  heartbeats). Queue access comes from queue ownership, not from the ACL. One CU may serve
  several groups; it is created with the first of them and deleted with the last.
- A publisher username (`cg-admin grant-publisher`), with client and ACL profiles named
  after it the same way: connect allowed, subscribe denied, publish denied except `<HP>/>`
  and `_lbg/<g>/summary` per group it publishes to; deleted with its last group.

Every check runs before anything is created; a failure part-way deletes what this run
created, newest first. Deleting a queue deletes its subscriptions with it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from lbg.broker.base import BrokerError, GroupExists, GroupNotFound
from lbg.broker.solace.semp import SempClient, SempError, segment
from lbg.model.destinations import SYSTEM_PREFIX, OutputKind
from lbg.model.group import GroupConfig, GroupConfigError, validate_group_name

log = logging.getLogger(__name__)

CONTROL_PREFIX = "_lbgctl"
JNDI_PREFIX = "lbg/"
PHYSICAL_NAME_MAX = 200
OUTPUT_SPOOL_MB = 1024
CLAIM_TTL_SECONDS = 600
CLAIMS_SPOOL_MB = 10
TOPIC_SYNTAX = "smf"


def queue_name(group: str, queue: int) -> str:
    return f"lbg.{group}.q{queue}"


def output_queue_name(group: str) -> str:
    return f"lbg.{group}.out"


def owners_queue_name(group: str) -> str:
    return f"lbg.{group}.owners"


def claim_topic(group: str, queue: int) -> str:
    """Where the new owner of a queue publishes its claim: `_lbgctl/<g>/owners/<q>`."""
    return f"{CONTROL_PREFIX}/{group}/owners/{queue}"


def claim_topics(group: str) -> str:
    return f"{CONTROL_PREFIX}/{group}/owners/>"


def jndi_name(group: str) -> str:
    return f"{JNDI_PREFIX}{group}"


def bucket_subscriptions(config: GroupConfig, queue: int) -> list[str]:
    """The queue's topic subscriptions: `<HP>/<b>/>` for each of its buckets."""
    return [f"{config.hash_prefix}/{b}/>" for b in config.buckets_for_queue(queue)]


def output_topics(group: str) -> str:
    """Everything the group's clients publish as output: `_lbg/<g>/>`."""
    return f"{SYSTEM_PREFIX}/{group}/>"


def control_topics(group: str) -> str:
    """The group's membership heartbeats and control messages: `_lbgctl/<g>/>`."""
    return f"{CONTROL_PREFIX}/{group}/>"


def acl_exceptions(group: str) -> list[tuple[str, str]]:
    """(kind, topic) of each ACL exception one group needs; kind names the SEMP collection."""
    return [
        ("publishTopicExceptions", output_topics(group)),
        ("publishTopicExceptions", control_topics(group)),
        ("subscribeTopicExceptions", control_topics(group)),
    ]


def publisher_exceptions(group: str, config: GroupConfig) -> list[tuple[str, str]]:
    """(kind, topic) of each ACL exception a publisher of the group needs: its events and
    its summary."""
    summary = f"{SYSTEM_PREFIX}/{group}/{OutputKind.SUMMARY.value}"
    return [
        ("publishTopicExceptions", f"{config.hash_prefix}/>"),
        ("publishTopicExceptions", summary),
    ]


def _exception_body(kind: str, topic: str) -> dict[str, str]:
    attribute = kind.removesuffix("s")
    return {attribute: topic, f"{attribute}Syntax": TOPIC_SYNTAX}


class Paths:
    """SEMP config paths of one Message VPN's objects."""

    def __init__(self, vpn: str) -> None:
        self.vpn = f"/msgVpns/{segment(vpn)}"

    def queues(self) -> str:
        return f"{self.vpn}/queues"

    def queue(self, name: str) -> str:
        return f"{self.queues()}/{segment(name)}"

    def subscriptions(self, queue: str) -> str:
        return f"{self.queue(queue)}/subscriptions"

    def jndi_queues(self) -> str:
        return f"{self.vpn}/jndiQueues"

    def jndi_queue(self, name: str) -> str:
        return f"{self.jndi_queues()}/{segment(name)}"

    def client_usernames(self) -> str:
        return f"{self.vpn}/clientUsernames"

    def client_username(self, name: str) -> str:
        return f"{self.client_usernames()}/{segment(name)}"

    def client_profiles(self) -> str:
        return f"{self.vpn}/clientProfiles"

    def client_profile(self, name: str) -> str:
        return f"{self.client_profiles()}/{segment(name)}"

    def acl_profiles(self) -> str:
        return f"{self.vpn}/aclProfiles"

    def acl_profile(self, name: str) -> str:
        return f"{self.acl_profiles()}/{segment(name)}"

    def acl_exceptions(self, profile: str, kind: str) -> str:
        return f"{self.acl_profile(profile)}/{kind}"

    def acl_exception(self, profile: str, kind: str, topic: str) -> str:
        return f"{self.acl_exceptions(profile, kind)}/{TOPIC_SYNTAX},{segment(topic)}"


def stored_json(name: str, config: GroupConfig) -> str:
    """The group JSON for the JNDI physicalName; refuses a name or config that does not fit."""
    try:
        validate_group_name(name)
        text = config.to_json()
    except GroupConfigError as exc:
        raise BrokerError(f"group '{name}': {exc}") from None
    if len(text) > PHYSICAL_NAME_MAX:
        raise BrokerError(
            f"group '{name}': config JSON is {len(text)} characters; the Solace JNDI physicalName"
            f" holds at most {PHYSICAL_NAME_MAX}"
        )
    return text


class Provisioner:
    """cg-admin's flows for the groups of one Message VPN."""

    def __init__(self, semp: SempClient, vpn: str) -> None:
        self.semp = semp
        self.vpn = vpn
        self.paths = Paths(vpn)

    async def read_group(self, name: str) -> GroupConfig:
        """The group's config from its JNDI object's physicalName."""
        try:
            record = await self.semp.find(self.paths.jndi_queue(jndi_name(name)))
        except SempError as exc:
            raise BrokerError(f"group '{name}': cannot read its JNDI object: {exc}") from None
        if record is None:
            raise GroupNotFound(
                f"group '{name}' does not exist (no JNDI queue '{jndi_name(name)}')"
            )
        try:
            return GroupConfig.from_json(record.get("physicalName") or "")
        except GroupConfigError as exc:
            raise BrokerError(f"group '{name}': stored config is invalid: {exc}") from None

    async def list_groups(self) -> dict[str, GroupConfig]:
        """Every group with a JNDI object `lbg/<g>`; unreadable configs are logged and skipped."""
        records = await self.semp.list(
            self.paths.jndi_queues(),
            where=f"queueName=={JNDI_PREFIX}*",
            select="queueName,physicalName",
        )
        groups = {}
        for record in records:
            name = str(record.get("queueName", "")).removeprefix(JNDI_PREFIX)
            try:
                groups[name] = GroupConfig.from_json(record.get("physicalName") or "")
            except GroupConfigError as exc:
                log.warning("JNDI queue '%s': not a group config: %s", record.get("queueName"), exc)
        return dict(sorted(groups.items()))

    async def create_group(
        self, name: str, config: GroupConfig, client_password: str | None = None
    ) -> None:
        """Check every name first (GroupExists names the clash), then create, undoing on failure."""
        document = stored_json(name, config)
        adopt = await self._check_clashes(name, config)
        created: list[str] = []
        try:
            await self._create_identity(
                name, config.client_username, client_password, adopt, created
            )
            for queue in range(config.queue_count):
                await self._create_queue(
                    created,
                    self._queue_body(queue_name(name, queue), config),
                    bucket_subscriptions(config, queue),
                )
            await self._create_queue(
                created, self._output_queue_body(name, config), [output_topics(name)]
            )
            await self._create_queue(
                created, self._owners_queue_body(name, config), [claim_topics(name)]
            )
            await self._add(
                created,
                self.paths.jndi_queues(),
                self.paths.jndi_queue(jndi_name(name)),
                {"queueName": jndi_name(name), "physicalName": document},
            )
        except SempError as exc:
            await self._undo(created)
            raise BrokerError(
                f"cannot create group '{name}': {exc} (undid {len(created)} objects)"
            ) from None

    async def delete_group(self, name: str) -> None:
        """Delete the group's queues and ACL exceptions, its CU if no other group uses it, then
        its JNDI object."""
        config = await self.read_group(name)
        user = config.client_username
        try:
            for queue in range(config.queue_count):
                await self._delete(self.paths.queue(queue_name(name, queue)))
            await self._delete(self.paths.queue(output_queue_name(name)))
            await self._delete(self.paths.queue(owners_queue_name(name)))
            if await self._manages(user):
                for kind, topic in acl_exceptions(name):
                    await self._delete(self.paths.acl_exception(user, kind, topic))
                others = [
                    g
                    for g, c in (await self.list_groups()).items()
                    if g != name and c.client_username == user
                ]
                if not others:
                    await self._delete(self.paths.client_username(user))
                    await self._delete(self.paths.acl_profile(user))
                    await self._delete(self.paths.client_profile(user))
            await self._delete(self.paths.jndi_queue(jndi_name(name)))
        except SempError as exc:
            raise BrokerError(f"cannot delete group '{name}': {exc}") from None

    async def upgrade_group(self, name: str, config: GroupConfig) -> list[str]:
        """The claims queue of a group made before it, if missing."""
        queue = owners_queue_name(name)
        try:
            if await self.semp.exists(self.paths.queue(queue)):
                return []
            created: list[str] = []
            try:
                await self._create_queue(
                    created, self._owners_queue_body(name, config), [claim_topics(name)]
                )
            except SempError:
                await self._undo(created)
                raise
        except SempError as exc:
            raise BrokerError(f"cannot upgrade group '{name}': {exc}") from None
        return [f"claims queue '{queue}'"]

    async def grant_publisher(
        self, group: str, config: GroupConfig, user: str, password: str | None
    ) -> None:
        """Check first, then create the publisher's profiles and username (unless lbg made
        them before) and add the group's exceptions it lacks; a failure undoes this run."""
        await self._refuse_client(user)
        adopt = await self._check_user(user)
        if not adopt and password is None:
            raise BrokerError(
                f"publisher username '{user}' does not exist: give a password to create it"
            )
        created: list[str] = []
        try:
            if not adopt:
                await self._add_profiles(user, receive=False, created=created)
            for kind, topic in publisher_exceptions(group, config):
                if not await self.semp.exists(self.paths.acl_exception(user, kind, topic)):
                    await self._add(
                        created,
                        self.paths.acl_exceptions(user, kind),
                        self.paths.acl_exception(user, kind, topic),
                        _exception_body(kind, topic),
                    )
            if not adopt:
                await self._add_username(user, password, created)
        except SempError as exc:
            await self._undo(created)
            raise BrokerError(
                f"cannot grant '{user}' publishing to '{group}': {exc}"
                f" (undid {len(created)} objects)"
            ) from None

    async def revoke_publisher(self, group: str, config: GroupConfig, user: str) -> None:
        """Delete the group's exceptions from the publisher's ACL profile; with the last of
        them go the username and its profiles."""
        await self._refuse_client(user)
        paths = [
            self.paths.acl_exception(user, k, t) for k, t in publisher_exceptions(group, config)
        ]
        granted = await self._manages(user) and any([await self.semp.exists(p) for p in paths])
        if not granted:
            raise BrokerError(f"user '{user}' is not a publisher of group '{group}'")
        try:
            for path in paths:
                await self._delete(path)
            left = await self.semp.list(
                self.paths.acl_exceptions(user, "publishTopicExceptions"),
                select="publishTopicException",
            )
            if not left:
                await self._delete(self.paths.client_username(user))
                await self._delete(self.paths.acl_profile(user))
                await self._delete(self.paths.client_profile(user))
        except SempError as exc:
            raise BrokerError(f"cannot revoke '{user}' publishing to '{group}': {exc}") from None

    async def _refuse_client(self, user: str) -> None:
        """A group's CU serves clients: publishing events would break its least privilege."""
        for name, config in (await self.list_groups()).items():
            if config.client_username == user:
                raise BrokerError(
                    f"user '{user}' is the client username (CU) of group '{name}':"
                    " a publisher needs a username of its own"
                )

    async def _check_clashes(self, name: str, config: GroupConfig) -> bool:
        """Raise GroupExists on the first clash; True if CU exists already and lbg manages it."""
        if await self.semp.exists(self.paths.jndi_queue(jndi_name(name))):
            raise GroupExists(f"group '{name}' already exists (JNDI queue '{jndi_name(name)}')")
        names = [queue_name(name, q) for q in range(config.queue_count)]
        for queue in [*names, output_queue_name(name), owners_queue_name(name)]:
            if await self.semp.exists(self.paths.queue(queue)):
                raise GroupExists(f"queue '{queue}' already exists")
        for other_name, other in (await self.list_groups()).items():
            if other.hash_prefix == config.hash_prefix:
                raise GroupExists(
                    f"hash prefix '{config.hash_prefix}' is already used by group '{other_name}'"
                )
        return await self._check_identity(name, config.client_username)

    async def _check_identity(self, name: str, user: str) -> bool:
        adopt = await self._check_user(user)
        if adopt:
            for kind, topic in acl_exceptions(name):
                if await self.semp.exists(self.paths.acl_exception(user, kind, topic)):
                    raise GroupExists(f"ACL profile '{user}' already has {kind[:-1]} '{topic}'")
        return adopt

    async def _check_user(self, user: str) -> bool:
        """Raise GroupExists if the username or its profiles clash with lbg's; True if the
        username exists with lbg's profiles (to adopt), False if none of them exists."""
        record = await self.semp.find(self.paths.client_username(user))
        if record is None:
            for kind, path in (
                ("client profile", self.paths.client_profile(user)),
                ("ACL profile", self.paths.acl_profile(user)),
            ):
                if await self.semp.exists(path):
                    raise GroupExists(
                        f"{kind} '{user}' already exists (lbg names the profiles of client"
                        f" username '{user}' after it)"
                    )
            return False
        acl, profile = record.get("aclProfileName"), record.get("clientProfileName")
        if acl != user or profile != user:
            raise GroupExists(
                f"client username '{user}' already exists with ACL profile '{acl}' and client"
                f" profile '{profile}', not lbg's '{user}'"
            )
        return True

    async def _manages(self, user: str) -> bool:
        """Whether CU is one lbg set up: it uses the ACL and client profiles named after it."""
        record = await self.semp.find(self.paths.client_username(user))
        return (
            record is not None
            and record.get("aclProfileName") == user
            and record.get("clientProfileName") == user
        )

    async def _create_identity(
        self, group: str, user: str, password: str | None, adopt: bool, created: list[str]
    ) -> None:
        """The client profile, ACL profile and CU (unless adopted), then the group's exceptions."""
        if not adopt:
            await self._add_profiles(user, receive=True, created=created)
        for kind, topic in acl_exceptions(group):
            await self._add(
                created,
                self.paths.acl_exceptions(user, kind),
                self.paths.acl_exception(user, kind, topic),
                _exception_body(kind, topic),
            )
        if not adopt:
            await self._add_username(user, password, created)

    async def _add_profiles(self, user: str, receive: bool, created: list[str]) -> None:
        """The client profile (guaranteed receive only if `receive`) and the ACL profile
        (connect allowed, every topic denied) named after the username."""
        await self._add(
            created,
            self.paths.client_profiles(),
            self.paths.client_profile(user),
            {
                "clientProfileName": user,
                "allowGuaranteedMsgSendEnabled": True,
                "allowGuaranteedMsgReceiveEnabled": receive,
                "allowGuaranteedEndpointCreateEnabled": False,
            },
        )
        await self._add(
            created,
            self.paths.acl_profiles(),
            self.paths.acl_profile(user),
            {
                "aclProfileName": user,
                "clientConnectDefaultAction": "allow",
                "publishTopicDefaultAction": "disallow",
                "subscribeTopicDefaultAction": "disallow",
            },
        )

    async def _add_username(self, user: str, password: str | None, created: list[str]) -> None:
        """The enabled client username with lbg's profiles (and its password, if given)."""
        body: dict[str, object] = {
            "clientUsername": user,
            "aclProfileName": user,
            "clientProfileName": user,
            "enabled": True,
        }
        if password is not None:
            body["password"] = password
        await self._add(
            created, self.paths.client_usernames(), self.paths.client_username(user), body
        )

    def _queue_body(self, name: str, config: GroupConfig) -> dict[str, object]:
        return {
            "queueName": name,
            "accessType": "exclusive" if config.exclusive else "non-exclusive",
            "permission": "no-access",
            "ingressEnabled": True,
            "egressEnabled": True,
            "maxMsgSpoolUsage": config.queue_size_mb,
            "owner": config.client_username,
        }

    def _output_queue_body(self, group: str, config: GroupConfig) -> dict[str, object]:
        return {
            "queueName": output_queue_name(group),
            "accessType": "non-exclusive",
            "permission": "read-only",
            "ingressEnabled": True,
            "egressEnabled": True,
            "maxMsgSpoolUsage": OUTPUT_SPOOL_MB,
            "owner": config.client_username,
        }

    def _owners_queue_body(self, group: str, config: GroupConfig) -> dict[str, object]:
        return {
            "queueName": owners_queue_name(group),
            "accessType": "non-exclusive",
            "permission": "no-access",
            "ingressEnabled": True,
            "egressEnabled": True,
            "maxMsgSpoolUsage": CLAIMS_SPOOL_MB,
            "respectTtlEnabled": True,
            "maxTtl": CLAIM_TTL_SECONDS,
            "owner": config.client_username,
        }

    async def _create_queue(
        self, created: list[str], body: dict[str, object], topics: Iterable[str]
    ) -> None:
        name = str(body["queueName"])
        await self._add(created, self.paths.queues(), self.paths.queue(name), body)
        for topic in topics:
            await self.semp.create(self.paths.subscriptions(name), {"subscriptionTopic": topic})

    async def _add(
        self, created: list[str], collection: str, path: str, body: dict[str, object]
    ) -> None:
        """Create one object and remember its path for the undo."""
        await self.semp.create(collection, body)
        created.append(path)

    async def _undo(self, created: list[str]) -> None:
        """Delete what a failed create made, newest first; keep going past errors."""
        for path in reversed(created):
            try:
                await self.semp.delete(path)
            except SempError as exc:
                log.warning("undo: %s", exc)

    async def _delete(self, path: str) -> None:
        """Delete one object; one that is already gone is fine."""
        try:
            await self.semp.delete(path)
        except SempError as exc:
            if not exc.not_found:
                raise
