"""Who stands in each queue's line behind its owner (brokers whose line takes a crashed
owner's queue over by itself): the member the queue would go to if its owner went."""

from hypothesis import given
from hypothesis import strategies as st

from lbg.model.overrides import assign_with_overrides, standby_assignment

MEMBERS = [f"m{i}" for i in range(6)]


@st.composite
def groups(draw: st.DrawFn) -> tuple[int, list[str], dict[int, str], dict[int, str]]:
    queue_count = draw(st.integers(min_value=1, max_value=24))
    members = draw(st.lists(st.sampled_from(MEMBERS), min_size=1, max_size=6, unique=True))
    holders = st.sampled_from([*MEMBERS, "gone"])
    current = draw(st.dictionaries(st.integers(0, queue_count - 1), holders))
    overrides = draw(st.dictionaries(st.integers(0, queue_count - 1), holders, max_size=3))
    return queue_count, members, current, overrides


@given(groups())
def test_a_standby_is_the_queues_owner_once_its_owner_is_gone(
    group: tuple[int, list[str], dict[int, str], dict[int, str]],
) -> None:
    queue_count, members, current, overrides = group
    assigned = assign_with_overrides(queue_count, members, current, overrides)
    standbys = standby_assignment(queue_count, members, current, overrides)
    for queue, standby in standbys.items():
        owner = assigned[queue]
        assert current.get(queue) == owner != standby
        assert standby in members
        rest = [m for m in members if m != owner]
        assert assign_with_overrides(queue_count, rest, current, overrides)[queue] == standby


@given(groups())
def test_every_held_queue_has_a_standby_when_two_members_are_left(
    group: tuple[int, list[str], dict[int, str], dict[int, str]],
) -> None:
    queue_count, members, current, overrides = group
    assigned = assign_with_overrides(queue_count, members, current, overrides)
    standbys = standby_assignment(queue_count, members, current, overrides)
    held = {q for q, owner in assigned.items() if current.get(q) == owner}
    assert set(standbys) == (held if len(members) > 1 else set())


def test_a_queue_on_the_move_has_no_standby_so_only_its_next_owner_waits_for_it() -> None:
    current = {0: "a", 1: "a"}
    assigned = assign_with_overrides(2, ["a", "b"], current, {})
    moving = next(q for q, owner in assigned.items() if owner == "b")
    standbys = standby_assignment(2, ["a", "b"], current, {})
    assert moving not in standbys
    assert standbys == {1 - moving: "b"}
