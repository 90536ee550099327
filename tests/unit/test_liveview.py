"""What the validator and the live view report while a group runs: handover times on the
records' own clock, a rate that does not depend on polling, handovers apart from key moves,
and progress lines that say only what is known."""

import uvloop

from lbg.devstack import demo
from lbg.liveview import LiveView
from lbg.model.sequence import Outcome, Report, SequenceChecker
from lbg.validator import Validator


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_handover_times_are_the_records_times_after_the_first_record() -> None:
    view = LiveView("g")

    view.queue_changed(0, None, "a", 1_000.0)
    view.queue_changed(0, "a", "b", 1_012.5)
    view.queue_changed(1, None, "b", 1_020.25)

    assert [h["at"] for h in view.handovers] == [0.0, 12.5, 20.25]
    assert view.owners == {0: "b", 1: "b"}


def test_the_rate_counts_records_read_whether_or_not_anyone_polled() -> None:
    clock = FakeClock()
    view = LiveView("g", clock=clock)
    observation = SequenceChecker().observe("k", 1, "a", 0)
    assert observation.outcome is Outcome.IN_ORDER

    for _ in range(5):
        for _ in range(200):
            view.observed(observation)
        clock.now += 1.0

    assert view.rate() == 200.0
    clock.now += 10.0
    assert view.rate() == 0.0


def test_handovers_count_queue_moves_and_reassignments_count_keys() -> None:
    checker = SequenceChecker()
    for key in ("k1", "k2", "k3"):
        checker.observe(key, 1, "a", 0)
    for key in ("k1", "k2", "k3"):
        checker.observe(key, 2, "b", 0)

    report = checker.report({"k1": 2, "k2": 2, "k3": 2})

    assert report.handovers == 1
    assert report.reassignments == 3
    assert Report(**report.to_dict()) == report


def test_progress_names_losses_only_once_they_are_known() -> None:
    line = Validator().progress_line()

    assert "?" not in line and "lost" not in line and "missing" not in line
    assert "handovers 0" in line


def test_a_demo_phase_prints_one_progress_line_per_step(monkeypatch) -> None:
    monkeypatch.setattr(demo, "PROGRESS_SECONDS", 0.05)
    lines: list[str] = []

    # 0.1005 s: the old loop slept the last half millisecond in a burst of identical lines.
    uvloop.run(demo._phase(demo.Timeline(lines.append), Validator(), 0.1005))

    assert len(lines) == 3, lines


def test_the_state_lists_the_parked_keys_with_their_event_counts() -> None:
    view = LiveView("g")
    report = Validator().report()
    state = view.state(report, {"order-2": {5, 6}, "order-1": {9}})
    assert state["parked"] == [{"key": "order-1", "events": 1}, {"key": "order-2", "events": 2}]
    assert view.state(report)["parked"] == []
