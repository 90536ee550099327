"""A standalone Spark cluster on loopback, from the pyspark package itself: one master, N workers.

For trying `lbg-replay --master spark://...` without a real cluster, and for the test that
kills an executor mid-job. The master and workers are JVMs started with pyspark's own
`spark-class`; their pids, URLs and folder are kept in `cluster.json` so `down` stops exactly
them. Executors are the workers' child processes (`CoarseGrainedExecutorBackend`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import orjson

from lbg.devstack.embedded import free_port

STATE_FILE = "cluster.json"
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
EXECUTOR_CLASS = "CoarseGrainedExecutorBackend"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


class SparkClusterError(Exception):
    """The cluster could not start or be found; the message is one line naming the cause."""


@dataclass(frozen=True)
class ClusterState:
    """What `up` started: the master URL, its web UI, and every JVM's pid."""

    folder: str
    master_url: str
    web_url: str
    master_pid: int
    worker_pids: list[int]


def spark_home() -> Path:
    """The installed pyspark package: it carries `bin/spark-class` and the jars."""
    import pyspark

    return Path(pyspark.__file__).parent


def cluster_environment(folder: Path) -> dict[str, str]:
    """What the master, workers and their executors need on this machine: loopback, the venv's
    Python for Python workers, logs and scratch under `folder`."""
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(folder / "logs"),
        "PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
    }


def _spawn(folder: Path, name: str, *args: str) -> int:
    """Start one JVM in its own session (stopped by pid, never by the caller's Ctrl-C)."""
    log = (folder / f"{name}.log").open("ab")
    with log:
        process = subprocess.Popen(
            [str(spark_home() / "bin" / "spark-class"), *args],
            env=cluster_environment(folder),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=folder,
        )
    return process.pid


def master_status(web_url: str) -> dict:
    """The master's own JSON view: status, alive workers, running apps."""
    with urllib.request.urlopen(f"{web_url}/json/", timeout=2) as answer:
        return orjson.loads(answer.read())


def _alive_workers(web_url: str) -> int:
    with contextlib.suppress(OSError, orjson.JSONDecodeError):
        status = master_status(web_url)
        if status.get("status") == "ALIVE":
            return int(status.get("aliveworkers", 0))
    return -1


def start_cluster(
    folder: Path, workers: int = 2, cores: int = 1, memory: str = "1g"
) -> ClusterState:
    """Start a master and `workers` workers of `cores` cores each; wait until all are alive."""
    folder.mkdir(parents=True, exist_ok=True)
    port, web_port = free_port(), free_port()
    master_url, web_url = f"spark://127.0.0.1:{port}", f"http://127.0.0.1:{web_port}"
    loopback = ["--host", "127.0.0.1"]
    master_args = [*loopback, "--port", str(port), "--webui-port", str(web_port)]
    master = _spawn(folder, "master", MASTER_CLASS, *master_args)
    state = ClusterState(str(folder), master_url, web_url, master, [])
    _write(folder, state)
    try:
        _wait(lambda: _alive_workers(web_url) >= 0, "the Spark master", folder / "master.log")
        worker_args = [*loopback, "--cores", str(cores), "--memory", memory, "--webui-port", "0"]
        pids = [
            _spawn(
                folder,
                f"worker-{n}",
                WORKER_CLASS,
                master_url,
                *worker_args,
                *("--work-dir", str(folder / f"work-{n}")),
            )
            for n in range(workers)
        ]
        state = ClusterState(str(folder), master_url, web_url, master, pids)
        _write(folder, state)
        _wait(lambda: _alive_workers(web_url) >= workers, "the Spark workers", folder)
    except BaseException:
        stop_cluster(state)
        raise
    return state


def _wait(ready: Callable[[], bool], what: str, where: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if time.monotonic() > deadline:
            raise SparkClusterError(
                f"{what} did not start within {START_TIMEOUT:.0f} s (see {where})"
            )
        time.sleep(0.3)


def _write(folder: Path, state: ClusterState) -> None:
    (folder / STATE_FILE).write_bytes(orjson.dumps(asdict(state), option=orjson.OPT_INDENT_2))


def read_state(folder: Path) -> ClusterState:
    """The cluster `up` started in `folder`; SparkClusterError if there is none."""
    try:
        return ClusterState(**orjson.loads((folder / STATE_FILE).read_bytes()))
    except FileNotFoundError:
        raise SparkClusterError(f"no Spark cluster in {folder} (start one with `up`)") from None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _is_spark(pid: int) -> bool:
    """Still one of ours (a pid may have been reused since `up`)."""
    return "org.apache.spark" in _cmdline(pid)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def executors(state: ClusterState) -> list[int]:
    """Pids of the executor JVMs our workers run now."""
    return [
        child
        for worker in state.worker_pids
        for child in _children(worker)
        if EXECUTOR_CLASS in _cmdline(child)
    ]


def kill_executor(state: ClusterState) -> int:
    """kill -9 one running executor (as a lost machine would); its pid."""
    running = executors(state)
    if not running:
        raise SparkClusterError("no executor is running")
    os.kill(running[0], signal.SIGKILL)
    return running[0]


def stop_cluster(state: ClusterState) -> None:
    """Stop the workers (and their executors), then the master; SIGKILL what outlives SIGTERM."""
    pids = [*executors(state), *state.worker_pids, state.master_pid]
    ours = [pid for pid in pids if _is_spark(pid)]
    for pid in ours:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT
    while time.monotonic() < deadline and any(_is_spark(pid) for pid in ours):
        time.sleep(0.2)
    for pid in ours:
        if _is_spark(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(FileNotFoundError):
        (Path(state.folder) / STATE_FILE).unlink()


@contextlib.contextmanager
def spark_cluster(folder: Path, workers: int = 2) -> Iterator[ClusterState]:
    """A cluster for the length of a `with` block."""
    state = start_cluster(folder, workers)
    try:
        yield state
    finally:
        stop_cluster(state)
