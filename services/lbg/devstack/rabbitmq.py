"""A private RabbitMQ node as a child of this project: free ports, its own folder, no systemd.

Debian's rabbitmq-server package provides the binaries (`apt-get install rabbitmq-server`);
the node keeps everything (mnesia, logs, Erlang cookie, epmd) under `data_dir`, so it never
touches a RabbitMQ the machine may already run. Start to ready takes about 10 s.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from lbg.devstack.embedded import BrokerStartError, free_port

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")
POLL_SECONDS = 0.2
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))
USER = "guest"
PASSWORD = "guest"


def find_rabbitmq() -> Path:
    """Folder of rabbitmq-server and rabbitmqctl (the package's unwrapped scripts)."""
    for folder in (RABBITMQ_BIN, Path(shutil.which("rabbitmq-server") or "/nonexistent").parent):
        if (folder / "rabbitmq-server").is_file() and (folder / "rabbitmqctl").is_file():
            return folder
    raise BrokerStartError(
        "rabbitmq-server not found: install Debian's package (apt-get install rabbitmq-server)"
    )


# How often the management plugin collects queue and consumer figures: fresher ones than
# RabbitMQ's default for `lbg status` in the tests; a bench of what production costs passes
# RABBITMQ_STATISTICS_MS (the figures' collection costs the broker per queue and consumer).
TEST_STATISTICS_MS = 500
RABBITMQ_STATISTICS_MS = 5000


class LocalRabbitMQ:
    """One RabbitMQ node on 127.0.0.1 with the management plugin, listening on free ports."""

    def __init__(self, data_dir: str | Path, statistics_ms: int = TEST_STATISTICS_MS) -> None:
        self.data_dir = Path(data_dir).absolute()
        self._statistics_ms = statistics_ms
        self.amqp_port = 0
        self.management_port = 0
        self._epmd_port = 0
        self._started = False

    @property
    def url(self) -> str:
        """AMQP URL with the default account and vhost."""
        return f"amqp://{USER}:{PASSWORD}@127.0.0.1:{self.amqp_port}/%2F"

    @property
    def admin_url(self) -> str:
        """Management API base URL."""
        return f"http://127.0.0.1:{self.management_port}"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "log"

    def _env(self) -> dict[str, str]:
        base = self.data_dir
        return {
            **os.environ,
            "HOME": str(base),
            "RABBITMQ_NODENAME": f"lbg{self.amqp_port}@localhost",
            "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.log_dir),
            "RABBITMQ_PID_FILE": str(base / "rabbitmq.pid"),
            "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(base / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(base / "rabbitmq-env.conf"),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "ERL_EPMD_PORT": str(self._epmd_port),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }

    def _write_config(self) -> None:
        base = self.data_dir
        base.mkdir(parents=True, exist_ok=True)
        (base / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{self.amqp_port}\n"
            f"management.tcp.ip = 127.0.0.1\n"
            f"management.tcp.port = {self.management_port}\n"
            f"collect_statistics_interval = {self._statistics_ms}\n",
            encoding="utf-8",
        )
        (base / "advanced.config").write_text("[].\n", encoding="utf-8")
        (base / "enabled_plugins").write_text("[rabbitmq_management].\n", encoding="utf-8")
        (base / "rabbitmq-env.conf").write_text("", encoding="utf-8")

    def start(self, timeout: float = 90.0) -> str:
        """Start the node and wait until the management API answers; return the AMQP URL."""
        folder = find_rabbitmq()
        if not self.amqp_port:
            self.amqp_port, self.management_port, self._epmd_port = (
                free_port(),
                free_port(),
                free_port(),
            )
        self._write_config()
        env = self._env()
        atexit.register(self.stop)
        self._started = True
        self._run(folder / "rabbitmq-server", "-detached", env=env)
        deadline = time.monotonic() + timeout
        self._run(
            folder / "rabbitmqctl",
            "wait",
            "--timeout",
            str(int(timeout)),
            env["RABBITMQ_PID_FILE"],
            env=env,
            timeout=timeout + 5,
        )
        while not self._management_ready():
            if time.monotonic() > deadline:
                raise BrokerStartError(
                    f"RabbitMQ management API not ready after {timeout:g} s "
                    f"(logs in {self.log_dir})"
                )
            time.sleep(POLL_SECONDS)
        return self.url

    def stop(self) -> None:
        """Stop the node and its private epmd; a node that is not running is fine."""
        atexit.unregister(self.stop)
        if not self._started:
            return
        self._started = False
        folder = find_rabbitmq()
        env = self._env()
        subprocess.run(
            [str(folder / "rabbitmqctl"), "stop", env["RABBITMQ_PID_FILE"]],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        epmd = shutil.which("epmd") or "/usr/lib/erlang/bin/epmd"
        subprocess.run(
            [epmd, "-port", str(self._epmd_port), "-kill"],
            env=env,
            capture_output=True,
            timeout=10,
            check=False,
        )

    def restart(self) -> str:
        """Stop the node and start it again on the same ports with its data; the AMQP URL."""
        self.stop()
        return self.start()

    def _run(self, *args: object, env: dict[str, str], timeout: float = 60.0) -> None:
        result = subprocess.run(
            [str(a) for a in args],
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            start_new_session=True,
        )
        if result.returncode != 0:
            output = " ".join((result.stderr or result.stdout).split())[-300:]
            raise BrokerStartError(
                f"{Path(str(args[0])).name} failed ({result.returncode}): {output}"
            )

    def _management_ready(self) -> bool:
        request = urllib.request.Request(f"{self.admin_url}/api/overview")
        token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
        try:
            with _DIRECT.open(request, timeout=1.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False
