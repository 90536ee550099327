"""Parked-key records and names (pure), and how the validator counts parked and skipped events."""

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from lbg.broker.base import OutputMessage
from lbg.model.destinations import OutputKind
from lbg.model.messages import (
    MAX_KEY_BYTES,
    MalformedMessage,
    Processed,
    encode_processed,
    encode_summaries,
)
from lbg.model.parking import (
    PARKED,
    REPLAY,
    SKIPPED_HEADER,
    ParkedKey,
    key_of,
    lot_headers,
    original_headers,
    parked,
    parked_again,
    replay_requested,
    stalled,
    token,
)
from lbg.validator import Validator

keys = st.text(st.characters(exclude_categories=("Cs",)), min_size=1).filter(
    lambda k: len(k.encode()) <= MAX_KEY_BYTES
)


@given(keys)
def test_a_keys_token_is_one_safe_name_and_gives_the_key_back(key: str) -> None:
    name = token(key)
    assert all(c.isascii() and (c.isalnum() or c in "-_") for c in name)
    assert key_of(name) == key


@pytest.mark.parametrize("name", ["", "!!", "gA"])
def test_a_name_that_is_no_token_is_refused(name: str) -> None:
    with pytest.raises(MalformedMessage):
        key_of(name)


def test_a_record_goes_through_its_states_and_survives_json() -> None:
    record = parked("k", "handler failed 4 times", 4, "client-a")
    assert record.parked and record.state == PARKED
    asked = replay_requested(record, "ops", skip_through=7)
    assert (asked.state, asked.requested_by, asked.skip_through) == (REPLAY, "ops", 7)
    again = parked_again(asked, "failed again", 2, "client-b")
    assert (again.state, again.reason, again.by) == (PARKED, "failed again", "client-b")
    assert ParkedKey.from_json(again.to_json()) == again
    suspect = stalled(None, "k", "client-a")
    assert not suspect.parked and stalled(suspect, "k", "client-b").stalls == 2


@pytest.mark.parametrize(
    "data", [b"{", b"[]", orjson.dumps({"key": "k", "state": "gone"}), orjson.dumps({"k": 1})]
)
def test_a_bad_record_is_refused_in_one_line(data: bytes) -> None:
    with pytest.raises(MalformedMessage):
        ParkedKey.from_json(data)


def test_a_parked_events_headers_give_the_original_ones_back() -> None:
    original = {"Lbg-Seq": "5", "trace": "x"}
    headers = lot_headers(original, reason="boom\nagain", attempts="4")
    assert headers["Lbg-Parked-Reason"] == "boom again"
    assert original_headers(headers) == original


def test_the_validator_reports_parked_and_skipped_events_apart_not_lost() -> None:
    validator = Validator()
    for seq in (1, 2, 3, 5):
        record = Processed("k", seq, "c", 0, 0)
        validator.handle(OutputMessage(OutputKind.VALIDATION, encode_processed(record), {}))
    for body in encode_summaries("p", {"k": 6}):
        validator.handle(OutputMessage(OutputKind.SUMMARY, body, {}))
    assert validator.report().lost == 2
    skipped = {"Lbg-Key": "k", "Lbg-Seq": "4", SKIPPED_HEADER: "ops", "Lbg-Reason": "skipped"}
    validator.handle(OutputMessage(OutputKind.DEAD, b"{}", skipped))
    validator.parked = {"k": {6}}
    report = validator.report()
    assert (report.lost, report.skipped, report.parked, report.dead_lettered) == (0, 1, 1, 0)
    assert "parked 1 skipped 1" in validator.progress_line()
