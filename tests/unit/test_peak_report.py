"""The peak picture's numbers: one row per second, and the verdict a user reads."""

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from lbg.devstack.peak import Handled, Sample, percentile, seconds, verdict, write_csv

START = 1_000.0


def test_rows_count_publishes_and_processing_in_their_own_seconds_with_latency_in_ms() -> None:
    handled = [
        Handled(START + 0.1, START + 0.1125, "client-0"),
        Handled(START + 0.5, START + 1.2, "client-0"),
        Handled(START + 0.9, START + 1.3005, "client-1"),
    ]
    samples = [Sample(START + 0.2, 1, 10, 0.25, 2), Sample(START + 1.4, 2, 3, 0.1, 2)]
    first, second = seconds(samples, handled, START)
    assert (first.published, first.processed, second.published, second.processed) == (3, 1, 0, 2)
    assert first.e2e_p50_ms == 12.5, "milliseconds with decimals"
    assert (second.e2e_p50_ms, second.e2e_p99_ms) == (400.5, 700.0)
    assert (first.backlog, first.oldest_age_s, first.clients) == (10, 0.25, 1)
    assert second.clients == 2


@given(
    st.lists(
        st.builds(
            Sample,
            st.floats(min_value=START, max_value=START + 30),
            st.integers(min_value=0, max_value=4),
            st.integers(min_value=0, max_value=500),
            st.floats(min_value=0, max_value=20),
            st.integers(min_value=0, max_value=4),
        ),
        max_size=40,
    ).map(lambda samples: sorted(samples, key=lambda s: s.at)),
    st.lists(
        st.tuples(st.floats(min_value=0, max_value=30), st.floats(min_value=0, max_value=5)),
        max_size=60,
    ),
)
def test_every_event_is_counted_once_each_way_and_no_second_is_missing(
    samples: list[Sample], times: list[tuple[float, float]]
) -> None:
    handled = [Handled(START + at, START + at + took, "c") for at, took in times]
    rows = seconds(samples, handled, START)
    assert [row.second for row in rows] == list(range(len(rows)))
    assert sum(row.published for row in rows) == len(handled)
    assert sum(row.processed for row in rows) == len(handled)
    assert all(row.e2e_p50_ms <= row.e2e_p99_ms for row in rows)
    assert max((r.backlog for r in rows), default=0) == max((s.backlog for s in samples), default=0)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile([], 0.5)) == (
        50.0,
        99.0,
        0.0,
    )


def test_the_verdict_times_the_scale_up_and_counts_the_steps(tmp_path: Path) -> None:
    samples = [
        Sample(START + 0, 1, 0, 0.0, 1),
        Sample(START + 1, 1, 400, 3.0, 4),  # the lag asks for 4
        Sample(START + 1.5, 4, 300, 2.0, 4),  # 4 running at the next poll
        Sample(START + 9, 4, 0, 0.0, 3),
        Sample(START + 15, 3, 0, 0.0, 2),
        Sample(START + 21, 2, 0, 0.0, 1),
        Sample(START + 27, 1, 0, 0.0, 1),
    ]
    handled = [
        Handled(START + 0.5, START + 0.6, "client-0"),
        Handled(START + 1.1, START + 2.7, "client-1"),  # the first event of a new client
        Handled(START + 1.2, START + 3.0, "client-2"),
    ]
    rows = seconds(samples, handled, START)
    judged = verdict(samples, handled, rows, drained=True, lag_limit=5)
    assert judged.kept_up and (judged.max_backlog, judged.max_lag_s) == (400, 3.0)
    assert (judged.reaction_start_s, judged.reaction_processing_s) == (0.5, 1.7)
    assert (judged.scale_ups, judged.scale_downs, judged.clients_path) == (1, 3, [1, 4, 3, 2, 1])
    assert judged.max_e2e_p99_ms == 1800.0
    text = judged.to_text()
    for words in ("kept up       yes", "max lag       3.00 s", "1 -> 4 -> 3 -> 2 -> 1"):
        assert words in text
    assert not verdict(samples, handled, rows, drained=False, lag_limit=5).kept_up
    assert not verdict(samples, handled, rows, drained=True, lag_limit=2).kept_up
    write_csv(tmp_path / "s.csv", rows)
    header = (tmp_path / "s.csv").read_text().splitlines()[0]
    assert header == (
        "second,published,processed,backlog,oldest_age_s,e2e_p50_ms,e2e_p99_ms,clients"
    )


def test_without_a_scale_up_the_reaction_is_unknown() -> None:
    samples = [Sample(START, 2, 5, 0.1, 2)]
    judged = verdict(samples, [], seconds(samples, [], START), drained=True, lag_limit=5)
    assert (judged.reaction_start_s, judged.reaction_processing_s, judged.scale_ups) == (
        None,
        None,
        0,
    )
    assert "scale-up      - from" in judged.to_text()
