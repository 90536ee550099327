"""Fuzzing the stored group JSON: any document parses or fails with one line naming the field."""

import json
import re

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.model.group import MAX_HASH_COUNT, GroupConfig, GroupConfigError

FIELDS = ("HP", "HC", "QC", "QS", "CU", "HF", "EX", "CA")
# What an error must start with: a field code, "group config JSON", or an unknown key.
NAMED = re.compile(r"^(?:[A-Z]{2} \([A-Za-z ]+\)|group config JSON): ")
MAX_MESSAGE = 300

INT64 = 2**63
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-INT64, max_value=INT64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=50)
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(), children),
    max_leaves=6,
)
# Values near each field's limits, so that range checks are hit as often as type checks.
edge_numbers = st.sampled_from(
    [-1, 0, 1, 2, 3, 4, 7, MAX_HASH_COUNT, MAX_HASH_COUNT + 1, INT64 - 1, INT64, 1.0, 2.5]
)
field_values = {
    "HP": st.sampled_from(["h", "_h", "a.b", "", "x" * 40, "x" * 41, "-a", "é"]) | json_values,
    "HC": edge_numbers | json_values,
    "QC": edge_numbers | json_values,
    "QS": edge_numbers | json_values,
    "CU": st.sampled_from(["u", "", "a b", "u" * 33, "u@x.y"]) | json_values,
    "HF": st.sampled_from(["java", "murmur2", "messagedb", "crc32", "", "JAVA"]) | json_values,
    "EX": st.sampled_from([0, 1, 2, -1, True, False, "1"]) | json_values,
    "CA": st.sampled_from(["account", "a:b+c", "a-b", "", ":a", "x" * 64, "x" * 65]) | json_values,
    "CP": st.text(max_size=10),
}
documents = st.fixed_dictionaries({}, optional=field_values) | st.dictionaries(
    st.sampled_from(FIELDS) | st.text(max_size=12), json_values, max_size=8
)


def parses_or_names_the_field(text: str | bytes) -> None:
    """from_json either returns a config that round-trips or raises a one-line, named error."""
    try:
        config = GroupConfig.from_json(text)
    except GroupConfigError as exc:
        message = str(exc)
        assert "\n" not in message and "\r" not in message, message
        assert len(message) <= MAX_MESSAGE, message
        assert NAMED.match(message) or ": unknown key (known keys: " in message, message
    else:
        assert GroupConfig.from_json(config.to_json()) == config


@settings(max_examples=300, deadline=None)
@given(document=documents)
def test_any_json_object_parses_or_names_the_field(document: dict) -> None:
    parses_or_names_the_field(orjson.dumps(document))


@settings(max_examples=200, deadline=None)
@given(value=json_values)
def test_any_json_value_parses_or_names_the_field(value: object) -> None:
    parses_or_names_the_field(orjson.dumps(value))


@settings(max_examples=200, deadline=None)
@given(raw=st.binary(max_size=120) | st.text(max_size=120))
def test_any_bytes_or_text_parse_or_give_a_group_config_error(raw: bytes | str) -> None:
    parses_or_names_the_field(raw)


@settings(max_examples=200, deadline=None)
@given(hc=edge_numbers | st.integers(), qc=edge_numbers | st.integers())
def test_counts_out_of_range_are_refused_naming_hc_or_qc(hc: object, qc: object) -> None:
    text = json.dumps({"HP": "h", "HC": hc, "QC": qc})
    valid = (
        all(isinstance(n, int) and not isinstance(n, bool) for n in (hc, qc))
        and 1 <= qc <= hc <= MAX_HASH_COUNT  # type: ignore[operator]
    )
    if valid:
        assert GroupConfig.from_json(text).hash_count == hc
        return
    with pytest.raises(GroupConfigError, match=r"^(HC|QC) \((hash|queue) count\): "):
        GroupConfig.from_json(text)


@pytest.mark.parametrize(
    ("document", "start"),
    [
        pytest.param({"HP": "h", "HC": 4, "QC": 2, "a\nb": 1}, "unknown key", id="key-newline"),
        pytest.param({"HP": "h", "HC": 4, "QC": 2, "k" * 500: 1}, "unknown key", id="key-long"),
        pytest.param({"HP": "h" * 5000, "HC": 4, "QC": 2}, "HP (hash prefix)", id="hp-long"),
        pytest.param({"HP": "h", "HC": [1] * 2000, "QC": 2}, "HC (hash count)", id="hc-list"),
        pytest.param({"HP": "h", "HC": 4, "QC": 2, "HF": "f" * 999}, "HF (hash", id="hf-long"),
    ],
)
def test_errors_about_huge_or_odd_values_stay_one_short_line(document: dict, start: str) -> None:
    with pytest.raises(GroupConfigError) as caught:
        GroupConfig.from_json(orjson.dumps(document))
    message = str(caught.value)
    assert start in message
    assert "\n" not in message and len(message) <= MAX_MESSAGE, message
