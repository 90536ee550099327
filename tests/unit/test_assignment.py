"""Static-mode primary rule of the original design."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.assignment import is_primary, primary_queues


def test_original_rule_examples() -> None:
    assert primary_queues(12, 0, 3) == [0, 3, 6, 9]
    assert primary_queues(12, 2, 3) == [2, 5, 8, 11]
    assert is_primary(7, 1, 3)
    assert not is_primary(7, 0, 3)


@given(st.integers(min_value=1, max_value=200), st.data())
def test_each_queue_has_exactly_one_primary_when_clients_fit(
    queue_count: int, data: st.DataObject
) -> None:
    client_count = data.draw(st.integers(min_value=1, max_value=queue_count))
    for queue in range(queue_count):
        primaries = [c for c in range(client_count) if is_primary(queue, c, client_count)]
        assert len(primaries) == 1
    every = sorted(
        q for c in range(client_count) for q in primary_queues(queue_count, c, client_count)
    )
    assert every == list(range(queue_count))


@given(st.integers(min_value=1, max_value=50), st.integers(min_value=1, max_value=50))
def test_extra_clients_have_no_primary(queue_count: int, extra: int) -> None:
    client_count = queue_count + extra
    for client in range(queue_count, client_count):
        assert primary_queues(queue_count, client, client_count) == []
        assert not any(is_primary(q, client, client_count) for q in range(queue_count))
    for client in range(queue_count):
        assert primary_queues(queue_count, client, client_count) == [client]


@given(
    st.integers(min_value=0, max_value=300),
    st.integers(min_value=1, max_value=40),
    st.data(),
)
def test_primary_queues_agrees_with_is_primary(
    queue_count: int, client_count: int, data: st.DataObject
) -> None:
    client = data.draw(st.integers(min_value=0, max_value=client_count - 1))
    expected = [q for q in range(queue_count) if is_primary(q, client, client_count)]
    assert primary_queues(queue_count, client, client_count) == expected


@pytest.mark.parametrize(
    ("client_index", "client_count", "message"),
    [
        (0, 0, "client count"),
        (-1, 3, "client index"),
        (3, 3, "client index"),
    ],
)
def test_invalid_client_is_named(client_index: int, client_count: int, message: str) -> None:
    with pytest.raises(ValueError, match=rf"^{message}"):
        is_primary(0, client_index, client_count)
    with pytest.raises(ValueError, match=rf"^{message}"):
        primary_queues(4, client_index, client_count)


def test_negative_queue_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"^queue: must be >= 0"):
        is_primary(-1, 0, 2)
    with pytest.raises(ValueError, match=r"^queue count: must be >= 0"):
        primary_queues(-1, 0, 2)
