"""Which client is preferred for which queue.

Static mode (the original design): client ``i`` of ``n`` is primary for queue ``q`` when
``q % n == i``. Dynamic mode: every member computes the same balanced, sticky assignment from
the membership view and the current owners; the broker's exclusivity keeps correctness even
when views disagree for a moment.
"""

from collections.abc import Iterable, Mapping


def _check_client(client_index: int, client_count: int) -> None:
    """Require 0 <= client_index < client_count, naming the offending value."""
    if client_count < 1:
        raise ValueError(f"client count: must be >= 1, got {client_count}")
    if not 0 <= client_index < client_count:
        raise ValueError(f"client index: must be in 0..{client_count - 1}, got {client_index}")


def is_primary(queue: int, client_index: int, client_count: int) -> bool:
    """Whether client ``client_index`` of ``client_count`` is the primary consumer of ``queue``."""
    _check_client(client_index, client_count)
    if queue < 0:
        raise ValueError(f"queue: must be >= 0, got {queue}")
    return (queue % client_count) - client_index == 0


def primary_queues(queue_count: int, client_index: int, client_count: int) -> list[int]:
    """The queues among ``range(queue_count)`` for which this client is primary, ascending."""
    _check_client(client_index, client_count)
    if queue_count < 0:
        raise ValueError(f"queue count: must be >= 0, got {queue_count}")
    return list(range(client_index, queue_count, client_count))


def balanced_assignment(
    queue_count: int, members: Iterable[str], current: Mapping[int, str]
) -> dict[int, str]:
    """Map every queue to a member: balanced, sticky and independent of the members' order.

    Each member gets ``queue_count // n`` or one more queue; never more members active than
    queues (the rest are hot standbys). A member keeps the queues it holds in ``current`` up to
    its share, and the members holding most now get the larger shares, so a join or a leave
    moves only the queues that must move.
    """
    if queue_count < 0:
        raise ValueError(f"queue count: must be >= 0, got {queue_count}")
    people = sorted(set(members))
    if not people:
        return {}
    base, extra = divmod(queue_count, len(people))
    held = {member: [] for member in people}
    for queue in sorted(current):
        owner = current[queue]
        if owner in held and 0 <= queue < queue_count:
            held[owner].append(queue)
    ranked = sorted(people, key=lambda member: (-len(held[member]), member))
    share = {member: base + (1 if rank < extra else 0) for rank, member in enumerate(ranked)}
    result: dict[int, str] = {}
    load = dict.fromkeys(people, 0)
    for member in people:
        for queue in held[member][: share[member]]:
            result[queue] = member
            load[member] += 1
    for queue in range(queue_count):
        if queue not in result:
            member = min((m for m in people if load[m] < share[m]), key=lambda m: (load[m], m))
            result[queue] = member
            load[member] += 1
    return result
