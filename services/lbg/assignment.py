"""Static-mode primary rule of the original design: which queues a client binds as primary.

Client ``i`` of ``n`` is primary for queue ``q`` when ``q % n == i``; other clients stand by.
"""


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
