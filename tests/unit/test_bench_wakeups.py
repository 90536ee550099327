"""bench/measure.py's wakeups(): idle.py's wake-up figure counts a process's sleeps, threads
included, so it must see every one of a known number."""

import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from measure import wakeups

SLEEPER = """
import sys, threading, time
def nap():
    for _ in range(40):
        time.sleep(0.002)
done = threading.Event()
def nap_then_stay():
    nap()
    done.set()
    sys.stdin.read()
threading.Thread(target=nap_then_stay, daemon=True).start()
nap()
done.wait()
print("done", flush=True)
sys.stdin.read()
"""


def test_a_process_sleeping_80_times_in_two_live_threads_woke_at_least_80_times() -> None:
    sleeper = subprocess.Popen(
        [sys.executable, "-c", SLEEPER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert sleeper.stdout is not None and sleeper.stdout.readline() == "done\n"
        counted = wakeups(sleeper.pid)
        assert counted is not None and 80 <= counted < 1000, counted
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_gone_process_has_no_wakeups() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert wakeups(gone.pid) is None
