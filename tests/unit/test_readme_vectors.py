"""The README's hash reference vectors are what the hash functions compute, so producers in
other languages can check their implementation against them."""

import re
from pathlib import Path

import pytest

from lbg.model.hashing import (
    java_bucket,
    java_string_hash,
    messagedb_bucket,
    murmur2,
    murmur2_bucket,
)

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `([^`]+)` \| (-?\d+) \| (\d+) \| (-?\d+) \| (\d+) \| (\d+) \|$", re.M)
ROWS = ROW.findall(README.read_text(encoding="utf-8"))


def test_the_readme_has_reference_vectors() -> None:
    assert len(ROWS) >= 5


@pytest.mark.parametrize("row", ROWS, ids=[row[0] for row in ROWS])
def test_a_reference_vector_is_what_the_functions_compute(row: tuple[str, ...]) -> None:
    key, java_hash, java, murmur, murmur_b, messagedb = row
    assert java_string_hash(key) == int(java_hash)
    assert java_bucket(key, 64) == int(java)
    assert murmur2(key.encode()) == int(murmur)
    assert murmur2_bucket(key, 64) == int(murmur_b)
    assert messagedb_bucket(key, 64) == int(messagedb)
