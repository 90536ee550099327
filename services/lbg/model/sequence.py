"""The validator's per-key sequence checking: order, gaps, duplicates, losses and reassignments.

Publishers number each key's events 1, 2, 3, ...; the checker classifies every delivery and keeps
only O(keys) state while deliveries arrive in order.
"""

import enum
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field


class Outcome(enum.Enum):
    """How one delivered (key, seq) relates to what was already seen for that key."""

    IN_ORDER = "in_order"
    GAP = "gap"
    DUPLICATE = "duplicate"
    REORDER = "reorder"


@dataclass(frozen=True)
class Observation:
    """The classification of one delivery, with the client that delivered the key before."""

    outcome: Outcome
    key: str
    seq: int
    client: str
    previous_client: str | None

    @property
    def reassigned(self) -> bool:
        """Whether the key moved here from another client."""
        return self.previous_client is not None


@dataclass
class Report:
    """The totals of one validation run; ``lost`` is None when nothing says what was published.

    ``handovers`` counts a queue's records starting to come from another client (a queue
    moved); ``reassignments`` counts a key's event coming from another client than its
    previous one (every key of a moved queue that has events counts once per move).
    """

    published: int | None
    delivered: int
    unique: int
    lost: int | None
    duplicates: int
    reordered: int
    gaps: int
    reassignments: int
    dead_lettered: int
    keys: int
    per_client: dict[str, int] = field(default_factory=dict)
    unsequenced: int = 0
    handovers: int = 0
    parked: int = 0
    skipped: int = 0

    @property
    def ok(self) -> bool:
        """Nothing known lost and nothing reordered (an unknown loss count is not ok)."""
        return self.lost == 0 and self.reordered == 0

    @property
    def verdict(self) -> str:
        """OK, FAILED (something lost or reordered) or UNKNOWN (nothing reordered, but no
        publisher summary yet says what was published, so losses cannot be counted)."""
        if self.ok:
            return "OK"
        return "UNKNOWN" if self.lost is None and self.reordered == 0 else "FAILED"

    def to_dict(self) -> dict[str, object]:
        """The report as plain JSON-ready data."""
        return asdict(self)

    def to_text(self) -> str:
        """A readable multi-line summary ending in the verdict."""
        rows: list[tuple[str, object]] = [
            ("published", _or_unknown(self.published)),
            ("delivered", self.delivered),
            ("unique", self.unique),
            ("lost", _or_unknown(self.lost)),
            ("duplicates", self.duplicates),
            ("reordered", self.reordered),
            ("gaps", self.gaps),
            ("handovers", self.handovers),
            ("reassignments", self.reassignments),
            ("dead-lettered", self.dead_lettered),
            ("keys", self.keys),
            ("unsequenced", self.unsequenced),
        ]
        lines = [f"{name:<14}{value}" for name, value in rows]
        lines.append("per client:")
        lines.extend(f"  {client:<12}{count}" for client, count in sorted(self.per_client.items()))
        unknown = " (no publisher summary yet: losses cannot be counted)"
        lines.append(f"{'result':<14}{self.verdict}{unknown if self.verdict == 'UNKNOWN' else ''}")
        return "\n".join(lines)


def _or_unknown(value: int | None) -> object:
    """The value, or the word 'unknown' when it is None."""
    return "unknown" if value is None else value


@dataclass(slots=True)
class _KeyState:
    """Seen seqs of one key: all of 1..watermark, plus the sparse set above it."""

    watermark: int = 0
    above: set[int] = field(default_factory=set)
    highest: int = 0
    last_client: str | None = None

    def seen(self, seq: int) -> bool:
        """Whether ``seq`` was delivered before."""
        return seq <= self.watermark or seq in self.above

    def add(self, seq: int) -> None:
        """Record a new ``seq``, advancing the watermark over any filled gap."""
        if seq != self.watermark + 1:
            self.above.add(seq)
            return
        self.watermark = seq
        while self.watermark + 1 in self.above:
            self.watermark += 1
            self.above.remove(self.watermark)

    def missing(self, last: int) -> int:
        """How many of 1..last were never seen."""
        if last <= self.watermark:
            return 0
        seen_above = sum(1 for seq in self.above if seq <= last)
        return last - self.watermark - seen_above


class SequenceChecker:
    """Classifies each delivered (key, seq) and keeps the counters for the final report."""

    def __init__(self) -> None:
        """Start with no keys seen."""
        self._keys: dict[str, _KeyState] = {}
        self._queue_owners: dict[int, str] = {}
        self._per_client: Counter[str] = Counter()
        self._counts: Counter[Outcome] = Counter()
        self._reassignments = 0
        self._handovers = 0

    def observe(self, key: str, seq: int, client: str, queue: int) -> Observation:
        """Classify one delivery of ``key``'s ``seq`` by ``client`` from ``queue``, and count it."""
        if seq < 1:
            raise ValueError(f"seq: must be >= 1, got {seq}")
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _KeyState()
        if state.seen(seq):
            outcome = Outcome.DUPLICATE
        elif seq == state.highest + 1:
            outcome = Outcome.IN_ORDER
        elif seq > state.highest:
            outcome = Outcome.GAP
        else:
            outcome = Outcome.REORDER
        if outcome is not Outcome.DUPLICATE:
            state.add(seq)
            state.highest = max(state.highest, seq)
        previous = state.last_client
        previous_client = previous if previous is not None and previous != client else None
        if previous_client is not None:
            self._reassignments += 1
        state.last_client = client
        if self._queue_owners.get(queue, client) != client:
            self._handovers += 1
        self._queue_owners[queue] = client
        self._per_client[client] += 1
        self._counts[outcome] += 1
        return Observation(outcome, key, seq, client, previous_client)

    def queue_owner(self, queue: int) -> str | None:
        """The client that delivered the latest message from ``queue``, if any."""
        return self._queue_owners.get(queue)

    def missing(self, key: str, last_published: int) -> int:
        """How many of ``key``'s seqs 1..last_published were never delivered."""
        state = self._keys.get(key)
        if state is None:
            return max(last_published, 0)
        return state.missing(last_published)

    def pending_above_watermark(self, key: str) -> int:
        """How many seqs of ``key`` are held individually above its contiguous watermark."""
        state = self._keys.get(key)
        return 0 if state is None else len(state.above)

    def _lost(self, published: Mapping[str, int], dead_lettered: Mapping[str, set[int]]) -> int:
        """Published seqs neither delivered nor dead-lettered, summed over keys."""
        lost = 0
        for key, last in published.items():
            state = self._keys.get(key, _KeyState())
            excused = sum(
                1 for seq in dead_lettered.get(key, ()) if 1 <= seq <= last and not state.seen(seq)
            )
            lost += state.missing(last) - excused
        return lost

    def report(
        self,
        published: Mapping[str, int] | None,
        dead_lettered: Mapping[str, set[int]] | None = None,
    ) -> Report:
        """Totals so far; ``published`` maps key -> last seq published (None: loss unknown)."""
        dead = dead_lettered or {}
        unique = sum(
            self._counts[outcome] for outcome in Outcome if outcome is not Outcome.DUPLICATE
        )
        return Report(
            published=None if published is None else sum(published.values()),
            delivered=self._per_client.total(),
            unique=unique,
            lost=None if published is None else self._lost(published, dead),
            duplicates=self._counts[Outcome.DUPLICATE],
            reordered=self._counts[Outcome.REORDER],
            gaps=self._counts[Outcome.GAP],
            reassignments=self._reassignments,
            handovers=self._handovers,
            dead_lettered=sum(len(seqs) for seqs in dead.values()),
            keys=len(self._keys),
            per_client=dict(self._per_client),
        )
