"""`make replay` keeps Java's and Spark's console lines off the terminal: a process started
while `console_to` holds stderr writes there for good, and the caller's stderr comes back."""

import os
import subprocess
import sys
from pathlib import Path

from lbg.replay.spark import console_to

LATE_WRITER = "import sys, time; time.sleep(0.3); sys.stderr.write('WARN from the JVM\\n')"


def test_a_child_started_meanwhile_keeps_writing_to_the_file(tmp_path: Path) -> None:
    log = tmp_path / "spark" / "spark.log"
    before = os.fstat(2)

    with console_to(log):
        child = subprocess.Popen([sys.executable, "-c", LATE_WRITER])
    child.wait(10)

    assert log.read_text() == "WARN from the JVM\n"
    after = os.fstat(2)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
