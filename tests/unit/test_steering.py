"""What a coordinator's round reads of the client's bindings: what they hold, found without
reading every binding each round, and the preferences it sets."""

import math
from dataclasses import dataclass
from typing import Any, cast

from tests.support.clock import Clock

from lbg.client.steering import BindingSteering, Holding


@dataclass
class FakeBinding:
    """Only what steering reads and sets of a binding; counts the reads of `active`, which
    ends unheard at no time, or not before `known_until` (on the test's clock)."""

    steady_waiting = True

    is_active: bool = False
    known_until: float = -math.inf
    preferred: bool = False
    reads: int = 0
    told: int = 0

    @property
    def active(self) -> bool:
        self.reads += 1
        return self.is_active

    @property
    def pin(self) -> str | None:
        return "pin" if self.is_active else None

    @property
    def waiting(self) -> bool:
        return self.preferred and not self.is_active

    def set_preferred(self, preferred: bool) -> None:
        self.preferred = preferred
        self.told += 1

    def active_known_until(self) -> float:
        return self.known_until


def steering(bindings: dict[int, FakeBinding], clock: Clock) -> BindingSteering:
    return BindingSteering(cast(dict[int, Any], bindings), lambda q: None, clock)


def test_a_round_reads_only_what_may_be_held_until_the_full_read_is_due() -> None:
    clock = Clock(10)
    bindings = {q: FakeBinding() for q in range(100)}
    steer = steering(bindings, clock)
    assert steer.holdings() == {}, "the first round reads everything: nothing held"
    steer.prefer_only([3])
    bindings[7].is_active = True  # nobody told: only the full read finds it
    clock.now += 0.1
    assert steer.holdings() == {3: Holding(False, None, True)}
    assert bindings[50].reads == 1, "an idle binding was read again before the full read"
    clock.now += BindingSteering.FULL_READ_SECONDS
    assert steer.holdings() == {3: Holding(False, None, True), 7: Holding(True, "pin", False)}


def test_a_binding_that_says_it_changed_is_read_at_the_next_round() -> None:
    clock = Clock(10)
    bindings = {q: FakeBinding() for q in range(10)}
    steer = steering(bindings, clock)
    steer.holdings()
    bindings[4].is_active = True
    steer.changed(4)
    clock.now += 0.1
    assert steer.holdings() == {4: Holding(True, "pin", False)}
    bindings[4].is_active = False  # what was held is read again until it holds nothing
    clock.now += 0.1
    assert steer.holdings() == {}


def test_preferences_are_told_once_and_again_to_a_new_binding_of_the_queue() -> None:
    clock = Clock(10)
    bindings = {q: FakeBinding() for q in range(4)}
    steer = steering(bindings, clock)
    steer.prefer_only([1, 2])
    steer.prefer_only([1, 2])
    assert [b.told for b in bindings.values()] == [0, 1, 1, 0]
    steer.prefer_only([2])
    assert not bindings[1].preferred and bindings[2].preferred
    bindings[2] = FakeBinding()  # the queue was retired and bound again (a resize)
    steer.prefer_only([2])
    assert bindings[2].preferred


def test_a_waiting_binding_is_taken_as_waiting_between_reads_and_a_new_one_read_at_once() -> None:
    """An idle member waits for many queues: each is read once per WAITING_READ_SECONDS,
    not every round; a preferred binding that does not wait yet is read every round, and
    one that stopped waiting without a word is seen within that time."""
    clock = Clock(10)
    bindings = {q: FakeBinding() for q in range(40)}
    steer = steering(bindings, clock)
    steer.holdings()
    steer.prefer_only(list(range(32)))
    clock.now += 0.1
    assert set(steer.holdings()) == set(range(32))
    reads = bindings[5].reads
    for _ in range(5):  # rounds within the second
        clock.now += 0.15
        assert set(steer.holdings()) == set(range(32))
    assert bindings[5].reads == reads, "a waiting binding was read at every round"
    bindings[5].preferred = False  # stops waiting, nobody told (a resize's switch)
    steer.changed(6)
    bindings[6].is_active = True
    clock.now += 0.05
    assert steer.holdings()[6] == Holding(True, "pin", False), "a change is read at once"
    clock.now += BindingSteering.WAITING_READ_SECONDS
    assert 5 not in steer.holdings(), "a silent change is seen within the waiting read"


def preferred_in_a_line(clock: Clock) -> tuple[dict[int, FakeBinding], BindingSteering]:
    """Queue 0's binding, preferred, on a broker where a wait may end by itself (a line)."""
    bindings = {0: FakeBinding()}
    bindings[0].steady_waiting = False  # type: ignore[misc]
    steer = steering(bindings, clock)
    steer.holdings()
    steer.prefer_only([0])
    return bindings, steer


def test_a_binding_whose_wait_may_end_by_itself_is_read_every_round() -> None:
    """Where a lost connection or consumer ends the wait (`steady_waiting` False: RabbitMQ's
    line, for one), a waiting binding is read at every round as before."""
    clock = Clock(10)
    bindings, steer = preferred_in_a_line(clock)
    for _ in range(3):
        clock.now += 0.15
        assert steer.holdings() == {0: Holding(False, None, True)}
    bindings[0].preferred = False  # its consumer went with its channel, say
    clock.now += 0.15
    assert steer.holdings() == {}, "a wait that ended by itself was taken as still on"


def test_a_binding_still_waiting_though_no_longer_preferred_is_read_every_round() -> None:
    """RabbitMQ's standby told to step out of a queue's line waits until its consumer is
    gone: it is read at every round while it does."""
    clock = Clock(10)
    bindings, steer = preferred_in_a_line(clock)
    clock.now += 0.15
    steer.holdings()
    steer.prefer_only([])
    bindings[0].preferred = True  # still in the line, leaving
    clock.now += 0.15
    assert steer.holdings() == {0: Holding(False, None, True)}


def serving_and_waiting(
    clock: Clock, known_until: float
) -> tuple[dict[int, FakeBinding], BindingSteering]:
    """An idle member of a QC 64 group: it serves queues 0-7 (each said it became active) and
    waits for 8-15 as their preferred standby; its bindings' activity ends unheard at no time
    before `known_until`."""
    bindings = {q: FakeBinding(known_until=known_until) for q in range(64)}
    steer = steering(bindings, clock)
    steer.holdings()
    steer.prefer_only(list(range(16)))
    for queue in range(8):
        bindings[queue].is_active = True
        steer.changed(queue)
    clock.now += 0.05
    assert set(steer.holdings()) == set(range(16))
    return bindings, steer


def test_an_idle_members_rounds_read_no_binding_while_what_it_holds_is_steady() -> None:
    """Where an active binding stops being so only with a word (Message DB), rounds between
    the waiting reads read nothing at all; a word, or a request of the steering's, brings the
    next round back to reading, and the waiting read comes all the same."""
    clock = Clock(10)
    bindings, steer = serving_and_waiting(clock, known_until=math.inf)
    reads = sum(b.reads for b in bindings.values())
    for _ in range(5):  # rounds within the second
        clock.now += 0.15
        assert steer.holdings() == {
            **{q: Holding(True, "pin", False) for q in range(8)},
            **{q: Holding(False, None, True) for q in range(8, 16)},
        }
    assert sum(b.reads for b in bindings.values()) == reads, "a steady round read a binding"
    bindings[3].is_active = False
    steer.changed(3)
    clock.now += 0.05
    assert steer.holdings()[3] == Holding(False, None, True), "a change is read at once"
    reads = bindings[0].reads
    steer.release(0)
    clock.now += 0.05
    steer.holdings()
    assert bindings[0].reads == reads + 1, "a released queue was not read at the next round"
    bindings[1].is_active = False  # stops without a word (it must not: seen all the same)
    clock.now += BindingSteering.WAITING_READ_SECONDS
    held = steer.holdings()
    assert held[1] == Holding(False, None, True), "a silent change is seen within the waiting read"


def test_an_active_binding_that_may_stop_unheard_at_any_time_is_read_every_round() -> None:
    """Where a computed condition may end the activity at any time, an active binding is read
    at every round."""
    clock = Clock(10)
    bindings, steer = serving_and_waiting(clock, known_until=-math.inf)
    bindings[2].is_active = False  # its stall, which no listener hears
    clock.now += 0.15
    assert steer.holdings()[2] == Holding(False, None, True)


def test_an_active_binding_is_read_again_once_its_activity_may_have_ended_unheard() -> None:
    """NATS: a stall ends an owner's activity unheard, but not before most of a priority
    timeout after its last answered pull: rounds before then read nothing, the first round
    after reads it (and finds the stall), however recent the waiting read."""
    clock = Clock(10)
    bindings, steer = serving_and_waiting(clock, known_until=clock.now + 0.4)
    reads = sum(b.reads for b in bindings.values())
    clock.now += 0.3
    steer.holdings()
    assert sum(b.reads for b in bindings.values()) == reads, "read before it could change"
    bindings[2].is_active = False  # its stall, which no listener hears
    clock.now += 0.15
    assert steer.holdings()[2] == Holding(False, None, True), "a possible stall went unread"
