"""A clock the test moves by hand: pure logic that takes a `clock` callable runs on it."""


class Clock:
    """Returns `now`, which the test sets."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now
