"""bench/rebalance.py holds a handover against the wait it added to the new owner's first
event, not the queue's whole silence: at a modest rate over many queues, most of a silence
is the wait for the next event to be published, which no handover can shorten."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

import rebalance
from lbg.broker.base import OutputMessage
from lbg.model.destinations import OutputKind
from lbg.model.messages import Processed, encode_processed

T0 = 1_800_000_000.0


def record(seq: int, client: str, published: float, done: float, queue: int = 0) -> OutputMessage:
    """The validation record of event `seq` of key k, published and processed at those times."""
    body = encode_processed(Processed("k", seq, client, queue, 0, published_at=T0 + published))
    return OutputMessage(OutputKind.VALIDATION, body, {}, at=T0 + done)


def test_an_event_is_ready_once_published_and_its_queues_previous_event_is_done() -> None:
    assert rebalance.ready_wait(10.0, 9.0, 10.25) == 0.25  # published last: from its publish
    assert rebalance.ready_wait(10.0, 11.0, 11.25) == 0.25  # queued behind the previous one
    assert rebalance.ready_wait(10.0, None, 10.5) == 0.5  # the queue's first event
    assert rebalance.ready_wait(None, 9.0, 10.0) is None  # a producer without a publish time


def test_the_added_wait_is_beyond_an_ordinary_records_and_never_negative() -> None:
    assert rebalance.added_wait(0.3, 0.1) == 0.3 - 0.1
    assert rebalance.added_wait(0.05, 0.1) == 0.0
    assert rebalance.added_wait(None, 0.1) is None
    assert rebalance.added_wait(0.3, None) is None


def test_a_new_owners_first_record_carries_its_wait_and_is_no_ordinary_record() -> None:
    tracker = rebalance.Tracker(queue_count=1)
    for message in (
        record(1, "a", published=0.0, done=0.01),  # the queue's first owner
        record(2, "a", published=0.1, done=0.12),
        record(3, "a", published=0.2, done=0.21),
        # published while a still worked on event 3: it waited 0.2 s from a's last record
        record(4, "b", published=0.205, done=0.41),
        record(5, "b", published=0.3, done=0.43),  # queued behind event 4: waited 0.02 s
    ):
        tracker.handle(message)

    assert [round(w, 3) for w in tracker.ordinary_waits] == [0.02, 0.01, 0.02]
    assert tracker.baseline_wait() is not None and round(tracker.baseline_wait(), 3) == 0.02
    first, handover = tracker.changes[0]
    assert first.old is None and round(first.new_wait, 3) == 0.01
    assert (handover.old, handover.new) == ("a", "b")
    assert round(handover.new_wait, 3) == 0.2


def test_a_silence_waiting_for_the_next_event_adds_nothing() -> None:
    tracker = rebalance.Tracker(queue_count=1)
    for message in (
        record(1, "a", published=0.0, done=0.01),
        record(2, "a", published=0.1, done=0.11),
        record(3, "b", published=0.6, done=0.61),  # the next event came 0.5 s later
    ):
        tracker.handle(message)
    handover = tracker.changes[0][-1]

    assert round(handover.new_at - handover.old_at, 3) == 0.5  # the old planned pause
    assert rebalance.added_wait(handover.new_wait, tracker.baseline_wait()) == 0.0


def test_planned_moves_leave_out_crash_takeovers_and_the_start_and_name_their_cause() -> None:
    def change(old: str | None, new: str, at: float) -> rebalance.Change:
        return rebalance.Change(0, old, None if old is None else T0 + at - 0.1, new, T0 + at)

    changes = {
        0: [change(None, "m1", 1), change("m1", "m3", 12), change("m3", "m1", 32)],
        1: [change("m2", "m4", 22), change("m4", "m2", 25)],
    }
    actions = [
        rebalance.Action("join", "m3", T0 + 11),
        rebalance.Action("leave", "m3", T0 + 31),
        rebalance.Action("join", "m4", T0 + 21),
        rebalance.Action("kill", "m4", T0 + 24),
    ]

    moves = rebalance.planned_moves(changes, actions, steady_from=T0 + 5)

    assert [(c.old, c.new, cause) for c, cause in moves] == [
        ("m1", "m3", "join"),
        ("m3", "m1", "leave"),
        ("m2", "m4", "join"),
    ]


def test_the_planned_target_is_judged_on_the_wait_added_not_on_the_pause_with_its_gap() -> None:
    def figures(p99: float) -> dict:
        return {"p50": p99, "p99": p99, "max": p99, "n": 4}

    clean = {"lost": 0, "reordered": 0}
    result = {
        "dynamic": {
            "join": figures(0.5),
            "crash": figures(0.8),
            "planned": figures(0.3),
            "planned_added": figures(0.02),
            "totals": clean,
            "false_alarms": {"evictions": 0, "fences": 0},
        },
        "static": {"totals": None},
        "ratio_static_dynamic_join_p50": None,
    }

    targets = rebalance.verdicts(result)

    assert targets["planned_wait_added_p99_below_100ms"] is True
    assert False not in targets.values()
