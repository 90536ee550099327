"""Least-privilege NATS users for one group: what its publisher and its clients may touch.

The server holds the users (NATS has no API to create them), so this renders the
`authorization` block of a nats-server config for a group; passwords stay out of it as
`$VARIABLE` references that nats-server reads from its environment. Run:

    python -m lbg.broker.nats.permissions --group orders --hash-prefix orders

- admin (cg-admin, the validator, `lbg` tools): everything.
- publisher: publish the group's events `<HP>.>` and its summary, read the group config.
- client (the group's CU): pull from, ack, unpin and reset the group's consumers only, write
  its queues' owner records, publish validation and dead-letter records and heartbeats, and
  keep the group's parked keys (its KV registry and its parking-lot stream), and hear its
  consumers' UNPINNED advisories (an idle standby waits for one instead of asking).
Each reads replies (JetStream API answers, publish acks, pulled messages) only on its own
inbox prefix `_INBOX.<user>` (the adapter connects with it), never on another user's.
The client may RESET its consumers because it needs to: on becoming pinned it rewinds the
consumer to its ack floor, so the previous owner's unacknowledged events come first, in order.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from lbg.broker.nats.adapter import CONFIG_BUCKET, CONTROL_PREFIX, OWNERS_BUCKET, events_stream
from lbg.broker.nats.connection import SUBJECT_TOKEN, inbox_prefix
from lbg.broker.nats.generations import history_key, marker_subject
from lbg.broker.nats.parking import LOT_PREFIX, lot_stream, registry_bucket
from lbg.broker.nats.unpins import pinned_subject, unpinned_subject
from lbg.model.destinations import SYSTEM_PREFIX, OutputKind

ADMIN_USER = "lbg-admin"
PUBLISHER_USER = "lbg-publisher"
CLIENT_USER = "lbg-client"


def read_config_subjects(group: str) -> list[str]:
    """Find the config bucket and get this group's key (direct get: one subject per key)."""
    stream = f"KV_{CONFIG_BUCKET}"
    return [
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.$KV.{CONFIG_BUCKET}.{group}",
        f"$JS.API.DIRECT.GET.{stream}.$KV.{CONFIG_BUCKET}.{history_key(group)}",
    ]


def replies(user: str) -> str:
    """The subscription that reads `user`'s replies and nobody else's."""
    return f"{inbox_prefix(user)}.>"


def publisher_permissions(group: str, hash_prefix: str, user: str) -> dict[str, Any]:
    """The group's events and its summary; nothing else (not the resize markers, which end a
    generation), and no subscription but its replies."""
    publish = [
        f"{hash_prefix}.>",
        f"{SYSTEM_PREFIX}.{group}.{OutputKind.SUMMARY.value}",
        *read_config_subjects(group),
    ]
    return {
        "publish": {"allow": publish, "deny": [marker_subject(hash_prefix)]},
        "subscribe": {"allow": [replies(user)]},
    }


def client_permissions(group: str, user: str) -> dict[str, Any]:
    """The group's consumers, owner records, outputs and heartbeats; never its events."""
    stream = events_stream(group)
    control = f"{CONTROL_PREFIX}.{group}.>"
    publish = [
        *read_config_subjects(group),
        *(
            f"$JS.API.CONSUMER.{verb}.{stream}.*"
            for verb in ("INFO", "MSG.NEXT", "UNPIN", "RESET", "DELETE")
        ),
        f"$JS.API.CONSUMER.LIST.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.ACK.{stream}.>",
        f"$JS.API.STREAM.INFO.KV_{OWNERS_BUCKET}",
        f"$JS.API.DIRECT.GET.KV_{OWNERS_BUCKET}.$KV.{OWNERS_BUCKET}.{group}.*",
        f"$KV.{OWNERS_BUCKET}.{group}.*",
        f"{SYSTEM_PREFIX}.{group}.{OutputKind.VALIDATION.value}",
        f"{SYSTEM_PREFIX}.{group}.{OutputKind.DEAD.value}",
        *parking_subjects(group),
        control,
    ]
    subscribe = [replies(user), control, unpinned_subject(stream), pinned_subject(stream)]
    return {"publish": {"allow": publish}, "subscribe": {"allow": subscribe}}


def parking_subjects(group: str) -> list[str]:
    """The group's parked-key registry (read, put, purge a key) and its parking lot (append,
    read with direct gets, trim with a purge): this group's only."""
    lot, bucket = lot_stream(group), registry_bucket(group)
    return [
        f"{LOT_PREFIX}.{group}.*",
        f"$JS.API.DIRECT.GET.{lot}",
        f"$JS.API.STREAM.PURGE.{lot}",
        f"$JS.API.STREAM.INFO.KV_{bucket}",
        f"$JS.API.DIRECT.GET.KV_{bucket}.$KV.{bucket}.*",
        f"$KV.{bucket}.*",
    ]


def authorization_block(
    group: str,
    hash_prefix: str,
    admin_user: str = ADMIN_USER,
    publisher_user: str = PUBLISHER_USER,
    client_user: str = CLIENT_USER,
) -> str:
    """A nats-server `authorization { users = [...] }` block; passwords as $VARIABLES.

    Every name must be one subject token: a wildcard or a dot would widen the permissions
    (`--group '*'`) or let one user's inbox prefix cover another's."""
    names = {
        "group": group,
        "hash prefix": hash_prefix,
        "admin user": admin_user,
        "publisher user": publisher_user,
        "client user": client_user,
    }
    for what, value in names.items():
        if not SUBJECT_TOKEN.fullmatch(value):
            raise ValueError(f"{what}: expected letters, digits, '-' or '_', got {value!r}")
    users = [
        (admin_user, "LBG_NATS_ADMIN_PASSWORD", None),
        (
            publisher_user,
            "LBG_NATS_PUBLISHER_PASSWORD",
            publisher_permissions(group, hash_prefix, publisher_user),
        ),
        (client_user, "LBG_NATS_CLIENT_PASSWORD", client_permissions(group, client_user)),
    ]
    lines = [
        f"# lbg group '{group}' (hash prefix '{hash_prefix}'): users with least privilege.",
        "authorization {",
        "  users = [",
    ]
    for user, variable, permissions in users:
        entry = f"    {{user: {json.dumps(user)}, password: ${variable}"
        if permissions is not None:
            rendered = json.dumps(permissions, indent=2).replace("\n", "\n    ")
            entry += f", permissions: {rendered}"
        lines.append(entry + "}")
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the block for one group (the group's CU names the client user)."""
    parser = argparse.ArgumentParser(
        prog="python -m lbg.broker.nats.permissions", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--group", required=True)
    parser.add_argument("--hash-prefix", required=True)
    parser.add_argument("--admin-user", default=ADMIN_USER)
    parser.add_argument("--publisher-user", default=PUBLISHER_USER)
    parser.add_argument("--client-user", default=CLIENT_USER, help="the group's CU")
    args = parser.parse_args(argv)
    try:
        block = authorization_block(
            args.group, args.hash_prefix, args.admin_user, args.publisher_user, args.client_user
        )
    except ValueError as exc:
        parser.error(str(exc))
    sys.stdout.write(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
