"""Where `lbg local up` records the stack it started (devstack/scaling.py), so that every
command given no broker finds the local stack's broker here."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import orjson

DEFAULT_FOLDER = "var/local"
STATE_FILE = "state.json"


class StackError(Exception):
    """The local stack is missing or in a state the command cannot work with."""


@dataclasses.dataclass
class StackState:
    """What `lbg local up` started: enough to find, scale and stop it from another process."""

    broker_url: str
    group: str
    admin_url: str | None = None
    broker_pid: int | None = None
    others: dict[str, int] = dataclasses.field(default_factory=dict)
    clients: dict[str, int] = dataclasses.field(default_factory=dict)
    next_client: int = 0
    client_args: list[str] = dataclasses.field(default_factory=list)
    metrics_port: int = 0

    def metrics_args(self, offset: int) -> list[str]:
        """`--metrics-port` for the daemon `offset` ports above the stack's base (none if 0):
        the validator serves on the base, the publisher on base+1, client-N on base+2+N."""
        return ["--metrics-port", str(self.metrics_port + offset)] if self.metrics_port else []

    @property
    def pids(self) -> list[int]:
        """Every process the stack started."""
        broker = [] if self.broker_pid is None else [self.broker_pid]
        return [*broker, *self.others.values(), *self.clients.values()]


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().split(") ", 1)[1][:1] != "Z"
    except (OSError, IndexError):
        return True


def load_state(folder: Path) -> StackState:
    """The state a stack left in `folder`; StackError if there is none or it is unreadable."""
    path = folder / STATE_FILE
    try:
        data = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        raise StackError(f"no local stack in {folder} (start one: lbg local up)") from None
    except orjson.JSONDecodeError as exc:
        raise StackError(f"{path}: not valid JSON ({exc})") from None
    return StackState(**data)


def running_state(folder: Path) -> StackState | None:
    """The state of a stack that still has a live process in `folder`; None if there is none."""
    try:
        state = load_state(folder)
    except StackError:
        return None
    return state if any(alive(pid) for pid in state.pids) else None
