"""Who is preferred for which queue: the static primary rule and the dynamic balanced assignment."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.model.assignment import balanced_assignment, is_primary, primary_queues


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


members_st = st.lists(st.text(min_size=1, max_size=5), max_size=12, unique=True)


@st.composite
def scenario(draw) -> tuple[int, list[str], dict[int, str]]:
    queue_count = draw(st.integers(min_value=0, max_value=24))
    members = draw(members_st)
    owners = st.one_of(st.sampled_from(members), st.text(max_size=3)) if members else st.text()
    current = draw(st.dictionaries(st.integers(0, queue_count + 2), owners, max_size=30))
    return queue_count, members, current


def counts(assignment: dict[int, str], members: list[str]) -> dict[str, int]:
    load = dict.fromkeys(members, 0)
    for owner in assignment.values():
        load[owner] += 1
    return load


@given(scenario())
def test_every_queue_has_one_member_and_shares_differ_by_at_most_one(case) -> None:
    queue_count, members, current = case
    result = balanced_assignment(queue_count, members, current)
    if not members:
        assert result == {}
        return
    assert sorted(result) == list(range(queue_count))
    assert set(result.values()) <= set(members)
    load = counts(result, members)
    assert max(load.values()) - min(load.values()) <= 1
    assert sum(1 for n in load.values() if n > 0) == min(len(members), queue_count)


@given(scenario(), st.randoms())
def test_the_result_does_not_depend_on_the_order_of_members(case, random) -> None:
    queue_count, members, current = case
    shuffled = list(members)
    random.shuffle(shuffled)
    assert balanced_assignment(queue_count, shuffled, current) == balanced_assignment(
        queue_count, members, current
    )


@given(scenario())
def test_members_keep_what_they_hold_up_to_their_share(case) -> None:
    queue_count, members, current = case
    result = balanced_assignment(queue_count, members, current)
    fair = queue_count // len(members) if members else 0
    for member in members:
        held = [q for q, o in current.items() if o == member and q < queue_count]
        kept = [q for q in held if result.get(q) == member]
        assert len(kept) >= min(len(held), fair)


@given(st.integers(1, 24), st.integers(1, 10))
def test_a_join_moves_only_what_the_newcomer_takes(queue_count: int, size: int) -> None:
    members = [f"m{i}" for i in range(size)]
    before = balanced_assignment(queue_count, members, {})
    after = balanced_assignment(queue_count, [*members, "new"], before)
    moved = [q for q in before if after[q] != before[q]]
    assert all(after[q] == "new" for q in moved)
    assert len(moved) == sum(1 for owner in after.values() if owner == "new")


@given(st.integers(1, 24), st.integers(2, 10), st.data())
def test_a_leave_moves_only_the_leavers_queues(queue_count: int, size: int, data) -> None:
    members = [f"m{i}" for i in range(size)]
    before = balanced_assignment(queue_count, members, {})
    leaver = data.draw(st.sampled_from(members))
    after = balanced_assignment(queue_count, [m for m in members if m != leaver], before)
    moved = {q for q in before if after[q] != before[q]}
    assert moved == {q for q, owner in before.items() if owner == leaver}


def test_first_assignment_is_round_robin_like_the_static_rule() -> None:
    assert balanced_assignment(4, ["b", "a"], {}) == {0: "a", 1: "b", 2: "a", 3: "b"}
