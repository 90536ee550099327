"""The validator's per-key sequence checker."""

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.model.sequence import Outcome, SequenceChecker


def _outcomes(seqs: list[int], key: str = "k") -> list[Outcome]:
    checker = SequenceChecker()
    return [checker.observe(key, seq, "c1", 0).outcome for seq in seqs]


def test_in_order() -> None:
    assert _outcomes([1, 2, 3]) == [Outcome.IN_ORDER] * 3


def test_gap_then_reorder() -> None:
    assert _outcomes([1, 3, 2]) == [Outcome.IN_ORDER, Outcome.GAP, Outcome.REORDER]


def test_first_message_above_one_is_a_gap() -> None:
    assert _outcomes([2, 1]) == [Outcome.GAP, Outcome.REORDER]


def test_same_seq_twice_is_a_duplicate() -> None:
    assert _outcomes([1, 2, 2]) == [Outcome.IN_ORDER, Outcome.IN_ORDER, Outcome.DUPLICATE]


def test_late_unseen_seq_is_reorder_but_seen_one_is_duplicate() -> None:
    assert _outcomes([1, 3, 2, 2]) == [
        Outcome.IN_ORDER,
        Outcome.GAP,
        Outcome.REORDER,
        Outcome.DUPLICATE,
    ]


def test_keys_are_independent() -> None:
    checker = SequenceChecker()
    assert checker.observe("a", 1, "c1", 0).outcome is Outcome.IN_ORDER
    assert checker.observe("b", 1, "c1", 0).outcome is Outcome.IN_ORDER
    assert checker.observe("a", 2, "c1", 0).outcome is Outcome.IN_ORDER


def test_reassignment_when_the_client_changes() -> None:
    checker = SequenceChecker()
    first = checker.observe("k", 1, "c1", 3)
    same = checker.observe("k", 2, "c1", 3)
    moved = checker.observe("k", 3, "c2", 3)
    assert (first.previous_client, first.reassigned) == (None, False)
    assert (same.previous_client, same.reassigned) == (None, False)
    assert (moved.previous_client, moved.reassigned) == ("c1", True)
    assert checker.queue_owner(3) == "c2"
    assert checker.queue_owner(4) is None
    report = checker.report({"k": 3})
    assert report.reassignments == 1
    assert report.per_client == {"c1": 2, "c2": 1}


def test_seq_below_one_is_rejected() -> None:
    with pytest.raises(ValueError, match="seq"):
        SequenceChecker().observe("k", 0, "c1", 0)


def test_lost_counted_against_published() -> None:
    checker = SequenceChecker()
    for seq in (1, 2, 4, 4):
        checker.observe("a", seq, "c1", 0)
    checker.observe("b", 1, "c2", 1)
    report = checker.report({"a": 5, "b": 1, "never-delivered": 2})
    assert report.published == 8
    assert report.lost == 2 + 0 + 2
    assert (report.delivered, report.unique, report.duplicates) == (5, 4, 1)
    assert (report.gaps, report.reordered, report.keys) == (1, 0, 2)
    assert checker.missing("a", 5) == 2
    assert checker.missing("a", 2) == 0
    assert checker.missing("never-delivered", 2) == 2
    assert not report.ok


def test_dead_lettered_seqs_are_not_lost() -> None:
    checker = SequenceChecker()
    for seq in (1, 3):
        checker.observe("k", seq, "c1", 0)
    report = checker.report({"k": 4}, {"k": {2}})
    assert report.lost == 1
    assert report.dead_lettered == 1
    assert checker.report({"k": 4}, {"k": {2, 4}}).lost == 0


def test_dead_lettered_but_delivered_seq_is_not_subtracted_twice() -> None:
    checker = SequenceChecker()
    checker.observe("k", 1, "c1", 0)
    assert checker.report({"k": 2}, {"k": {1}}).lost == 1


def test_unknown_published_means_unknown_loss() -> None:
    checker = SequenceChecker()
    checker.observe("k", 1, "c1", 0)
    report = checker.report(None)
    assert report.published is None
    assert report.lost is None
    assert not report.ok
    assert "unknown" in report.to_text()
    assert report.to_text().splitlines()[-1].split()[:2] == ["result", "UNKNOWN"]


def test_unknown_published_with_a_reorder_still_fails() -> None:
    checker = SequenceChecker()
    for seq in (2, 1):
        checker.observe("k", seq, "c1", 0)
    assert checker.report(None).verdict == "FAILED"


def test_report_outputs() -> None:
    checker = SequenceChecker()
    for seq in (1, 2, 3):
        checker.observe("k", seq, "c1", 0)
    report = checker.report({"k": 3})
    assert report.ok
    data = orjson.loads(orjson.dumps(report.to_dict()))
    assert data["lost"] == 0
    assert data["per_client"] == {"c1": 3}
    text = report.to_text()
    assert "delivered" in text
    assert "c1" in text
    assert text.splitlines()[-1].split() == ["result", "OK"]


def test_per_client_counts_stay_apart_from_long_client_names() -> None:
    """Dynamic members are named client-<host>-<pid>, longer than any fixed column."""
    checker = SequenceChecker()
    checker.observe("k", 1, "client-3c1fe0eb1311-7", 0)
    checker.observe("k", 2, "c1", 0)
    lines = checker.report({"k": 2}).to_text().splitlines()
    per_client = lines[lines.index("per client:") + 1 : -1]
    assert [line.split() for line in per_client] == [["c1", "1"], ["client-3c1fe0eb1311-7", "1"]]


def test_reorder_fails_the_report() -> None:
    checker = SequenceChecker()
    for seq in (2, 1):
        checker.observe("k", seq, "c1", 0)
    report = checker.report({"k": 2})
    assert report.lost == 0
    assert report.reordered == 1
    assert not report.ok
    assert report.to_text().splitlines()[-1].split() == ["result", "FAILED"]


def test_watermark_keeps_memory_bounded_in_order() -> None:
    checker = SequenceChecker()
    for seq in range(1, 100_001):
        checker.observe("k", seq, "c1", 0)
    assert checker.pending_above_watermark("k") == 0
    assert checker.missing("k", 100_000) == 0
    assert checker.missing("k", 100_002) == 2


def test_watermark_collapses_when_gaps_fill() -> None:
    checker = SequenceChecker()
    for seq in (1, 3, 4, 6):
        checker.observe("k", seq, "c1", 0)
    assert checker.pending_above_watermark("k") == 3
    assert checker.missing("k", 6) == 2
    checker.observe("k", 2, "c1", 0)
    assert checker.pending_above_watermark("k") == 1
    checker.observe("k", 5, "c1", 0)
    assert checker.pending_above_watermark("k") == 0
    assert checker.missing("k", 6) == 0
    assert checker.pending_above_watermark("unknown") == 0


@st.composite
def deliveries(draw: st.DrawFn) -> tuple[int, list[int], int]:
    n = draw(st.integers(min_value=1, max_value=60))
    extras = draw(st.lists(st.integers(min_value=1, max_value=n), max_size=30))
    order = draw(st.permutations(list(range(1, n + 1)) + extras))
    return n, order, len(extras)


@given(deliveries())
def test_permutation_with_duplicates(delivery: tuple[int, list[int], int]) -> None:
    n, order, extras = delivery
    checker = SequenceChecker()
    for seq in order:
        checker.observe("k", seq, "c1", 0)
    report = checker.report({"k": n})
    assert report.unique == n
    assert report.duplicates == extras
    assert report.delivered == n + extras
    assert report.lost == 0
    assert checker.pending_above_watermark("k") == 0
    first_occurrences = list(dict.fromkeys(order))
    assert (report.reordered == 0) == (first_occurrences == sorted(first_occurrences))
