"""One line for a broker failure: an exception's text, or its type when it has none."""

from lbg.broker.base import why


def test_an_exception_without_text_is_named_by_its_type() -> None:
    assert why(ConnectionResetError()) == "ConnectionResetError"
    assert why(Exception("")) == "Exception"
    assert why(TimeoutError("no confirm in 5s")) == "no confirm in 5s"
