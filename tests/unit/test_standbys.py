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
        assert assign_with_overrides(queue_count, rest, assigned, overrides)[queue] == standby


@given(groups())
def test_a_move_in_progress_changes_no_standby_of_the_queues_that_stay(
    group: tuple[int, list[str], dict[int, str], dict[int, str]],
) -> None:
    """While queues move (a join, a leave), the others' lines hold the standbys they will
    hold once the moves are done: no line is joined for the moment of the move alone."""
    queue_count, members, current, overrides = group
    assigned = assign_with_overrides(queue_count, members, current, overrides)
    during = standby_assignment(queue_count, members, current, overrides)
    settled = standby_assignment(queue_count, members, assigned, overrides)
    assert during == {q: m for q, m in settled.items() if q in during}


def test_a_joiner_stands_ready_for_its_share_not_for_every_queue() -> None:
    """A member joining a settled group of 4 at QC 1024 holds nothing yet: it is made standby
    for about a fifth of the queues, as it will be once it holds its own (it was the standby
    of all 820 queues that stayed where they were, a channel each on RabbitMQ)."""
    old = [f"m{i}" for i in range(4)]
    settled = assign_with_overrides(1024, old, {}, {})
    standbys = standby_assignment(1024, [*old, "joiner"], settled, {})
    mine = sum(member == "joiner" for member in standbys.values())
    assert 150 <= mine <= 260, f"the joiner is standby for {mine} of {len(standbys)} queues"


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
