"""A sample dataset: a storefront's Black Friday order events, skewed, with a per-order sequence.

Every order is created, may change its item's quantity, and ends paid, paid and shipped,
cancelled, paid then cancelled, or still open. A few big orders (Zipf-like weights) carry a large
share of the quantity changes and a few accounts place many orders, so there are hot keys. The
file is in time order, as an event log would be; `event_seq` (1, 2, 3, ... per order) and `ts`
(strictly increasing, unique over the file) let a replay restore each key's order.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from lbg.replay import KEY_COLUMN, ORDER_COLUMN

EVENT_TYPES = ("order_created", "quantity_changed", "paid", "shipped", "cancelled")
CREATED, CHANGED, PAID, SHIPPED, CANCELLED = range(len(EVENT_TYPES))
BLACK_FRIDAY = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
DAY_MICROS = 86_400_000_000
ROW_GROUP_ROWS = 128 * 1024

# What happens after an order's quantity changes (its "tail"), and how often.
_TAILS: tuple[tuple[int, ...], ...] = (
    (),
    (PAID,),
    (PAID, SHIPPED),
    (CANCELLED,),
    (PAID, CANCELLED),
)
_TAIL_SHARES = (0.10, 0.25, 0.52, 0.08, 0.05)
# Orders per hour of the day: the midnight door-buster rush, a morning lull, an evening peak.
_HOURLY_TRAFFIC = (9, 7, 4, 2, 1, 1, 2, 3, 4, 5, 5, 5, 6, 6, 5, 5, 5, 6, 7, 8, 9, 9, 8, 7)

SCHEMA = pa.schema(
    [
        pa.field(KEY_COLUMN, pa.string(), nullable=False),
        pa.field("account_id", pa.string(), nullable=False),
        pa.field(ORDER_COLUMN, pa.int32(), nullable=False),
        pa.field("event_type", pa.string(), nullable=False),
        pa.field("ts", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("sku", pa.string()),
        pa.field("quantity", pa.int32()),
        pa.field("amount_cents", pa.int64()),
    ]
)


class DatasetError(ValueError):
    """Sizes that cannot make a dataset; the message names the option."""


@dataclass(frozen=True)
class DatasetSpec:
    """How big and how skewed the generated day is; the same spec and seed give the same rows."""

    rows: int = 200_000
    orders: int = 0
    accounts: int = 0
    skus: int = 2_000
    skew: float = 1.1
    hot_share: float = 0.1
    seed: int = 0

    @property
    def order_count(self) -> int:
        """Orders to generate: as given, else one per 20 rows."""
        return self.orders or max(1, self.rows // 20)

    @property
    def account_count(self) -> int:
        """Accounts placing the orders: as given, else one per 4 orders."""
        return self.accounts or max(1, self.order_count // 4)

    def check(self) -> None:
        """Raise DatasetError naming the first option out of range."""
        if self.rows < 1:
            raise DatasetError(f"rows: must be >= 1, got {self.rows}")
        if self.order_count > self.rows // 3:
            raise DatasetError(
                f"orders: at most rows/3 ({self.rows // 3}) so every order can end, "
                f"got {self.order_count}"
            )
        for name, value in (("accounts", self.account_count), ("skus", self.skus)):
            if value < 1:
                raise DatasetError(f"{name}: must be >= 1, got {value}")
        if not 0 <= self.skew <= 4:
            raise DatasetError(f"skew: must be between 0 and 4, got {self.skew}")
        if not 0 <= self.hot_share <= 1:
            raise DatasetError(f"hot-share: must be between 0 and 1, got {self.hot_share}")


def hot_weights(count: int, skew: float, hot_share: float, rng: np.random.Generator) -> np.ndarray:
    """Probabilities over `count` items: `hot_share` of the mass Zipf-like (1/rank**skew), the
    rest uniform; ranks are shuffled so the hot items are anywhere."""
    zipf = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** skew
    weights = hot_share * zipf / zipf.sum() + (1.0 - hot_share) / count
    return rng.permutation(weights / weights.sum())


def _names(prefix: str, count: int, width: int) -> pa.Array:
    return pa.array([f"{prefix}{number:0{width}d}" for number in range(count)], pa.string())


def _times(rows: int, rng: np.random.Generator) -> np.ndarray:
    """`rows` distinct microsecond offsets into the day, in random order, following the traffic."""
    hours = np.asarray(_HOURLY_TRAFFIC, dtype=np.float64)
    edges = np.concatenate([[0.0], np.cumsum(hours) / hours.sum()])
    quantiles = (np.arange(rows, dtype=np.float64) + 0.5) / rows
    offsets = np.interp(quantiles, edges, np.linspace(0, DAY_MICROS, len(edges))).astype(np.int64)
    steps = np.arange(rows, dtype=np.int64)
    offsets = np.maximum.accumulate(offsets - steps) + steps
    return rng.permutation(offsets)


def generate(spec: DatasetSpec) -> pa.Table:
    """The day's events as an Arrow table in time order (see the module docstring)."""
    spec.check()
    rng = np.random.default_rng(spec.seed)
    orders, rows = spec.order_count, spec.rows
    tails = rng.choice(len(_TAILS), size=orders, p=_TAIL_SHARES)
    tail_lengths = np.array([len(tail) for tail in _TAILS])[tails]
    base = 1 + tail_lengths
    extra = rows - int(base.sum())
    if extra < 0:
        raise DatasetError(f"rows: too few for {orders} orders (need {int(base.sum())})")
    lengths = base + rng.multinomial(extra, hot_weights(orders, spec.skew, spec.hot_share, rng))

    order_of_row = np.repeat(np.arange(orders), lengths)
    starts = np.cumsum(lengths) - lengths
    seq = np.arange(rows) - np.repeat(starts, lengths) + 1
    from_end = np.repeat(lengths, lengths) - seq
    types = np.full(rows, CHANGED, dtype=np.int8)
    types[seq == 1] = CREATED
    for tail_code, tail in enumerate(_TAILS):
        for position, event_type in enumerate(tail):
            chosen = (tails[order_of_row] == tail_code) & (from_end == len(tail) - 1 - position)
            types[chosen] = event_type

    times = _times(rows, rng)
    times = times[np.lexsort((times, order_of_row))]
    accounts, skus = spec.account_count, spec.skus
    account_weights = hot_weights(accounts, spec.skew, spec.hot_share, rng)
    account_of_order = rng.choice(accounts, size=orders, p=account_weights)
    sku_of_order = rng.choice(
        skus, size=orders, p=hot_weights(skus, spec.skew, spec.hot_share, rng)
    )
    price_cents = rng.integers(499, 99_999, size=skus)
    has_item = (types == CREATED) | (types == CHANGED)
    quantity = np.where(types == CREATED, rng.integers(1, 4, size=rows), rng.integers(1, 11, rows))
    last_item_row = np.maximum.accumulate(np.where(has_item, np.arange(rows), 0))
    amount = price_cents[sku_of_order[order_of_row]] * quantity[last_item_row]

    start = int(BLACK_FRIDAY.timestamp() * 1_000_000)
    table = pa.table(
        {
            KEY_COLUMN: _names("BF26-", orders, 7).take(pa.array(order_of_row)),
            "account_id": _names("acct-", accounts, 6).take(
                pa.array(account_of_order[order_of_row])
            ),
            ORDER_COLUMN: pa.array(seq, pa.int32()),
            "event_type": pa.array(EVENT_TYPES).take(pa.array(types)),
            "ts": pa.array(start + times, pa.timestamp("us", tz="UTC")),
            "sku": pc.if_else(
                pa.array(has_item),
                _names("sku-", skus, 5).take(pa.array(sku_of_order[order_of_row])),
                pa.scalar(None, pa.string()),
            ),
            "quantity": pa.array(quantity, pa.int32(), mask=~has_item),
            "amount_cents": pa.array(amount, pa.int64(), mask=types != PAID),
        },
        schema=SCHEMA,
    )
    return table.take(pa.array(np.argsort(times, kind="stable")))


def write_dataset(table: pa.Table, path: str | Path) -> Path:
    """Write the table as one Parquet file (parent folders created); returns the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, target, row_group_size=ROW_GROUP_ROWS)
    return target
