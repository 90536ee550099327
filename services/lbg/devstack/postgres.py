"""A private PostgreSQL with Message DB, as a child of this project: free port, no systemd.

Debian's postgresql package provides the binaries (`apt-get install postgresql`); the cluster
lives in its own temporary folder (socket included), so it never touches the machine's own
PostgreSQL. initdb and postgres refuse to run as root: as root they run as the `postgres`
user. Message DB itself comes from the npm registry (`@eventide/message-db`) and is installed
with its own install script; nothing of its SQL is copied into this project.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from lbg.devstack.embedded import BrokerStartError, free_port

POSTGRES_ROOT = Path("/usr/lib/postgresql")
MESSAGE_DB_PACKAGE = "@eventide/message-db@1.3.1"
MESSAGE_DB_CACHE_ENV = "LBG_MESSAGE_DB_DIR"
DATABASE = "message_store"
SUPERUSER = "postgres"


def find_postgres() -> Path:
    """The bin folder of the newest PostgreSQL from Debian's packages."""
    versions = sorted(
        (p for p in POSTGRES_ROOT.glob("*/bin") if (p / "initdb").is_file()),
        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0,
    )
    if not versions:
        raise BrokerStartError(
            "PostgreSQL not found: install Debian's package (apt-get install postgresql)"
        )
    return versions[-1]


def message_db_dir() -> Path:
    """The installed npm package's database/ folder: $LBG_MESSAGE_DB_DIR or ~/.cache/lbg."""
    cache = Path(
        os.environ.get(MESSAGE_DB_CACHE_ENV) or Path.home() / ".cache" / "lbg" / "message-db"
    )
    database = cache / "node_modules" / "@eventide" / "message-db" / "database"
    if (database / "install.sh").is_file():
        return database
    npm = shutil.which("npm")
    if npm is None:
        raise BrokerStartError("npm not found: install Debian's package (apt-get install npm)")
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [npm, "install", "--no-save", "--prefix", str(cache), MESSAGE_DB_PACKAGE],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0 or not (database / "install.sh").is_file():
        output = " ".join((result.stderr or result.stdout).split())[-300:]
        raise BrokerStartError(f"npm install {MESSAGE_DB_PACKAGE} failed: {output}")
    return database


def install_message_db(url: str, create_database: bool) -> None:
    """Run Message DB's own install script against the database that `url` names."""
    parts = urlsplit(url)
    database = parts.path.lstrip("/") or DATABASE
    env = {
        **os.environ,
        "PGHOST": parts.hostname or "127.0.0.1",
        "PGPORT": str(parts.port or 5432),
        "PGUSER": parts.username or SUPERUSER,
        "DATABASE_NAME": database,
        "CREATE_DATABASE": "on" if create_database else "off",
    }
    if parts.password:
        env["PGPASSWORD"] = parts.password
    script = message_db_dir() / "install.sh"
    result = subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    if result.returncode != 0:
        output = " ".join((result.stderr or result.stdout).split())[-300:]
        raise BrokerStartError(f"Message DB install into '{database}' failed: {output}")


def message_db_installed(url: str) -> bool:
    """True if the database `url` names already has Message DB's write_message function."""
    parts = urlsplit(url)
    env = {**os.environ, "PGPASSWORD": parts.password or ""}
    result = subprocess.run(
        [
            "psql",
            "-qtA",
            "-h",
            parts.hostname or "127.0.0.1",
            "-p",
            str(parts.port or 5432),
            "-U",
            parts.username or SUPERUSER,
            "-d",
            parts.path.lstrip("/") or DATABASE,
            "-c",
            "SELECT to_regproc('message_store.write_message') IS NOT NULL",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode == 0 and result.stdout.strip() == "t"


class LocalPostgres:
    """One PostgreSQL cluster on 127.0.0.1 and a free port, with Message DB installed."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir).absolute()
        self.port = 0
        self._cluster: Path | None = None

    @property
    def url(self) -> str:
        """The Message DB database, as the superuser (trust authentication on loopback)."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{DATABASE}"

    def start(self) -> str:
        """initdb, start the server, install Message DB; return the database URL."""
        binaries = find_postgres()
        self.port = free_port()
        self._cluster = Path(tempfile.mkdtemp(prefix="lbg-postgres-"))
        data = self._cluster / "data"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.stop)
        self._own(self._cluster)
        self._run(
            binaries / "initdb",
            "-D",
            data,
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
        )
        options = (
            f"-p {self.port} -k {self._cluster} -c listen_addresses=127.0.0.1 "
            "-c max_connections=300 -c fsync=off -c synchronous_commit=off"
        )
        self._run(
            binaries / "pg_ctl",
            "-D",
            data,
            "-o",
            options,
            "-l",
            self._cluster / "postgres.log",
            "-w",
            "-t",
            "60",
            "start",
        )
        install_message_db(self.url, create_database=True)
        return self.url

    def restart(self) -> None:
        """Stop and start the server on the same port, keeping its data."""
        if self._cluster is None:
            raise BrokerStartError("PostgreSQL is not running")
        self._run(
            find_postgres() / "pg_ctl",
            "-D",
            self._cluster / "data",
            "-l",
            self._cluster / "postgres.log",
            "-w",
            "-m",
            "fast",
            "restart",
        )

    def stop(self) -> None:
        """Stop the server and remove its cluster; a server that is not running is fine."""
        atexit.unregister(self.stop)
        cluster, self._cluster = self._cluster, None
        if cluster is None:
            return
        with contextlib.suppress(subprocess.SubprocessError, BrokerStartError):
            self._run(find_postgres() / "pg_ctl", "-D", cluster / "data", "-m", "fast", "stop")
        with contextlib.suppress(OSError):
            shutil.copy(cluster / "postgres.log", self.log_dir / "postgres.log")
        shutil.rmtree(cluster, ignore_errors=True)

    def _own(self, folder: Path) -> None:
        """Give the cluster folder to the postgres user when running as root."""
        if os.geteuid() == 0:
            user = pwd.getpwnam(SUPERUSER)
            os.chown(folder, user.pw_uid, user.pw_gid)

    def _run(self, *args: object) -> None:
        command = [str(a) for a in args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", SUPERUSER, "--", *command]
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            start_new_session=True,
            cwd="/",
        )
        if result.returncode != 0:
            output = " ".join((result.stderr or result.stdout).split())[-300:]
            raise BrokerStartError(
                f"{Path(str(args[0])).name} failed ({result.returncode}): {output}"
            )
