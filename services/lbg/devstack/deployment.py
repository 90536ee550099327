"""Run the daemons as real local processes: the demo, the tests and `make scale` share this.

Each daemon is a separate OS process (so kill -9 and SIGSTOP are real), started from the
console scripts installed next to the running Python, logging to its own file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


def script(name: str) -> str:
    """Path of one of this package's console scripts in the running environment."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


@dataclass
class Daemon:
    """One running daemon process and where its log goes."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def running(self) -> bool:
        return self.process.poll() is None

    def send(self, signum: int) -> None:
        """Deliver a signal if the process still runs (SIGKILL, SIGTERM, SIGSTOP, SIGCONT)."""
        if self.running:
            os.kill(self.process.pid, signum)

    def wait(self, timeout: float) -> int:
        """Wait for the exit code; SIGKILL after `timeout` so nothing is left behind."""
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class LocalDeployment:
    """The daemons of one group on one broker, as local processes under `workdir`."""

    broker_url: str
    group: str
    workdir: Path
    daemons: dict[str, Daemon] = field(default_factory=dict)
    admin_url: str | None = None
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, program: str, *args: str) -> Daemon:
        """Start `program` with the broker and group flags, `extra_args` (e.g. a config file
        for what the broker needs beyond its URL) and `args`; logs to `<name>.log`."""
        command = [
            script(program),
            "--broker-url",
            self.broker_url,
            "--group",
            self.group,
            *self.extra_args,
            *args,
        ]
        return self.spawn(name, command)

    def spawn(self, name: str, command: list[str]) -> Daemon:
        """Start any command as one of this deployment's processes (stopped by `stop_all`),
        in its own session, logging to `<name>.log`: e.g. a bench's own programs."""
        log_path = self.workdir / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        daemon = Daemon(name, process, log_path)
        self.daemons[name] = daemon
        return daemon

    def start_client(
        self, client_id: str, index: int, count: int, cycle_seconds: float, *args: str
    ) -> Daemon:
        """Start an lbg-client in static mode with the given index among `count`."""
        return self.start(
            client_id,
            "lbg-client",
            "--id",
            client_id,
            "--client-index",
            str(index),
            "--client-count",
            str(count),
            "--cycle-seconds",
            str(cycle_seconds),
            *args,
        )

    def start_publisher(self, name: str, *args: str) -> Daemon:
        """Start a hashed-publisher with the given flags (keys, rate, duration, ...)."""
        return self.start(name, "hashed-publisher", "--id", name, *args)

    def stop_all(self, timeout: float = 10.0) -> None:
        """SIGCONT and SIGTERM everything still running, then wait (SIGKILL after timeout)."""
        for daemon in self.daemons.values():
            daemon.send(signal.SIGCONT)
            daemon.send(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for daemon in self.daemons.values():
            daemon.wait(max(0.1, deadline - time.monotonic()))
