"""A SparkSession that works from a bare venv here and on a real cluster, unchanged.

Local masters, and a standalone master on loopback (`lbg spark-cluster up`), get what this
kind of machine needs (loopback driver, temp folders, the venv's Python for the workers, a
quick-starting JVM); any other master keeps its own settings, and under spark-submit the
master and config given there win.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from lbg.replay import DEFAULT_MASTER

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

APP_NAME = "lbg-replay"
LOOPBACK = ("127.0.0.1", "localhost")
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def _quiet() -> None:
    """PySpark warns on pandas 3 at every Arrow call (the Arrow-only path used here is fine),
    and py4j logs every closed connection."""
    logging.getLogger("py4j").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")
    warnings.filterwarnings("ignore", message=r".*PySpark does not yet fully support pandas.*")


@contextlib.contextmanager
def console_to(path: Path) -> Iterator[None]:
    """Send this process's stderr (fd 2) to `path` meanwhile: a JVM started inside inherits
    it, so Java's and Spark's console warnings (and Spark tasks' own lines) go to that file
    for as long as it runs, and the terminal keeps only what the caller prints."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with path.open("ab") as log_file:
        os.dup2(log_file.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def _on_this_machine(master: str) -> bool:
    """local[N], or a standalone master on loopback (`lbg spark-cluster up`)."""
    return master.startswith("local") or urlsplit(master).hostname in LOOPBACK


def spark_session(master: str | None = None, app_name: str = APP_NAME) -> SparkSession:
    """The running session (spark-submit's), else a new one on `master` (default local[2])."""
    _quiet()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    chosen = master or SparkConf().get("spark.master", DEFAULT_MASTER)
    builder = SparkSession.builder.master(chosen).appName(app_name)
    builder = builder.config("spark.ui.showConsoleProgress", "false")
    if _on_this_machine(chosen):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        scratch = tempfile.mkdtemp(prefix="lbg-spark-")
        atexit.register(shutil.rmtree, scratch, ignore_errors=True)
        for key, value in {
            "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1",
            "spark.local.dir": scratch,
            "spark.sql.warehouse.dir": os.path.join(scratch, "warehouse"),
            "spark.ui.enabled": "false",
            "spark.driver.extraJavaOptions": QUICK_JVM,
        }.items():
            builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
