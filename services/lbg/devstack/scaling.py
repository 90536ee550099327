"""Scaling a group's clients at run time: a local stack kept in a folder, and the autoscaler.

`LocalStack` is what `lbg local up` leaves running (broker, group, validator, publisher and N
dynamic lbg-clients as separate processes) with its state in `<folder>/state.json`, so that a
later `lbg local scale N` (`make scale N=4`) starts or stops only the difference: the other
clients keep running, and dynamic membership moves just the queues that must move.

`lbg autoscale` (lbg.admin.autoscale) drives a stack through `LocalStack.scale`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import orjson

from lbg.cli.localstate import (
    STATE_FILE,
    StackError,
    StackState,
    alive,
    load_state,
    running_state,
)
from lbg.devstack.deployment import script
from lbg.model.sequence import Report

log = logging.getLogger(__name__)
REPORT_FILE = "validator-report.json"
STOP_TIMEOUT = 15.0
VERDICT_TIMEOUT = 30.0


def stop_process(pid: int, timeout: float = STOP_TIMEOUT) -> None:
    """SIGTERM (a client hands its queues over), then SIGKILL after `timeout`."""
    if not alive(pid):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(pid):
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


class LocalStack:
    """A group's daemons as detached local processes, described by `<folder>/state.json`."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.absolute()

    @property
    def state_path(self) -> Path:
        return self.folder / STATE_FILE

    @property
    def report_path(self) -> Path:
        """Where the stack's validator writes its final report (read by `down`)."""
        return self.folder / REPORT_FILE

    def running(self) -> StackState | None:
        """The state of a stack that still has a live process here; None if there is none."""
        return running_state(self.folder)

    def clear(self) -> None:
        """Remove what an earlier run left (logs, report, broker data, a stale state file), so
        that a new run's logs and report are its own."""
        for leftover in [*self.folder.glob("*.log"), self.report_path, self.state_path]:
            leftover.unlink(missing_ok=True)
        shutil.rmtree(self.folder / "nats", ignore_errors=True)

    def load(self) -> StackState:
        """The stack's state; StackError if there is none or it is unreadable."""
        return load_state(self.folder)

    def save(self, state: StackState) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.state_path.with_suffix(".tmp")
        temporary.write_bytes(orjson.dumps(dataclasses.asdict(state), option=orjson.OPT_INDENT_2))
        temporary.replace(self.state_path)

    def start(self, name: str, *command: str) -> int:
        """Start a process of the stack, detached, logging to `<folder>/<name>.log`."""
        with (self.folder / f"{name}.log").open("ab") as log_file:
            process = subprocess.Popen(
                [script(command[0]), *command[1:]],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        return process.pid

    def spawn(self, state: StackState, name: str, program: str, *args: str) -> int:
        """Start one of the group's daemons against the stack's broker and group."""
        return self.start(
            name, program, "--broker-url", state.broker_url, "--group", state.group, *args
        )

    def running_clients(self, state: StackState) -> dict[str, int]:
        return {name: pid for name, pid in state.clients.items() if alive(pid)}

    def scale(self, count: int) -> tuple[list[str], list[str]]:
        """Run exactly `count` clients: start new ones or SIGTERM the newest; the others stay.

        Returns the names started and the names stopped.
        """
        if count < 0:
            raise StackError(f"client count must be >= 0, got {count}")
        state = self.load()
        running = self.running_clients(state)
        started: list[str] = []
        stopped: list[str] = []
        while len(running) < count:
            number = state.next_client
            name = f"client-{number}"
            state.next_client += 1
            args = ("--id", name, *state.client_args, *state.metrics_args(2 + number))
            running[name] = self.spawn(state, name, "lbg-client", *args)
            started.append(name)
        for name in sorted(running, key=_client_number, reverse=True)[: len(running) - count]:
            stop_process(running.pop(name))
            stopped.append(name)
        state.clients = running
        self.save(state)
        return started, stopped

    def down(self, verdict_timeout: float = VERDICT_TIMEOUT) -> Report | None:
        """Stop the publisher (it sends its summary), let the clients drain until the validator
        has accounted for every event and exits by itself (at most `verdict_timeout` s), stop
        the clients (clean handovers), the validator and the broker; the validator's report
        (None if it wrote none)."""
        state = self.load()
        publisher = state.others.pop("publisher", None)
        validator = state.others.get("validator")
        if publisher is not None and alive(publisher):
            stop_process(publisher)
            if validator is not None:
                _wait_for_exit(validator, verdict_timeout)
        for pid in [*state.clients.values(), *state.others.values()]:
            stop_process(pid)
        if state.broker_pid is not None:
            stop_process(state.broker_pid)
        self.state_path.unlink(missing_ok=True)
        try:
            return Report(**orjson.loads(self.report_path.read_bytes()))
        except (OSError, orjson.JSONDecodeError, TypeError):
            return None


def _wait_for_exit(pid: int, timeout: float) -> None:
    """Wait until the process exits by itself, at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)


def _client_number(name: str) -> int:
    _, _, number = name.rpartition("-")
    return int(number) if number.isdigit() else -1
