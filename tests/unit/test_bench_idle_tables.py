"""bench/idle.py prints one table per figure; their columns line up, whatever the length of
each table's title (they did not: each table's columns started after its own title)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

from idle import Size, show


def test_every_tables_broker_columns_end_where_the_others_do() -> None:
    results = {
        "nats": {"sizes": [{"clients_cpu_pct": 6.3, "join_s": [0.71, 0.8], "crash_s": [0.46]}]},
        "rabbitmq": {"sizes": [{"clients_cpu_pct": 17.2, "join_s": [1.02, 1.06]}]},
    }
    lines = [line for line in show(results, [Size(256, 8)]) if line]
    headers = [line for line in lines if line.rstrip().endswith("rabbitmq")]
    rows = [line for line in lines if line.startswith("QC 256 x 8")]
    assert len(headers) == len(rows) == 11, lines
    assert len({len(line.rstrip()) for line in headers + rows}) == 1, "\n".join(lines)
    assert len({line.index("nats") for line in headers}) == 1, "\n".join(headers)
    assert any("0.76 / 0.80" in row and "1.04 / 1.06" in row for row in rows), rows
