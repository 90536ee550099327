"""Per-key lanes: order within a key, concurrency across keys, a failed event stops its lane."""

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from lbg.client.lanes import KeyLanes


def run(coro):
    return asyncio.run(coro)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 3)), max_size=40),
    st.integers(1, 8),
)
def test_each_key_runs_in_submission_order(events, window: int) -> None:
    async def scenario() -> dict[str, list[int]]:
        lanes = KeyLanes(window)
        done: dict[str, list[int]] = {}

        def work(key: str, n: int, delay: int):
            async def go() -> bool:
                await asyncio.sleep(delay / 1000)
                done.setdefault(key, []).append(n)
                return True

            return go

        for n, (key, delay) in enumerate(events):
            await lanes.submit(key, work(key, n, 3 - delay))
        await lanes.drain()
        return done

    done = run(scenario())
    for key, ns in done.items():
        assert ns == sorted(ns), key
    assert sum(len(ns) for ns in done.values()) == len(events)


def test_keys_run_concurrently_up_to_the_window() -> None:
    async def scenario() -> int:
        lanes = KeyLanes(3)
        active = peak = 0

        async def slow() -> bool:
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.01)
            active -= 1
            return True

        for key in "abcdef":
            await lanes.submit(key, slow)
        await lanes.drain()
        return peak

    assert run(scenario()) == 3


def test_one_stuck_key_does_not_hold_up_the_others() -> None:
    async def scenario() -> list[str]:
        lanes = KeyLanes(4)
        release = asyncio.Event()
        finished: list[str] = []

        def work(key: str, wait: bool):
            async def go() -> bool:
                if wait:
                    await release.wait()
                finished.append(key)
                return True

            return go

        await lanes.submit("stuck", work("stuck", True))
        for key in "xyz":
            await lanes.submit(key, work(key, False))
        await asyncio.sleep(0.01)
        early = list(finished)
        release.set()
        await lanes.drain()
        return early

    assert run(scenario()) == ["x", "y", "z"]


def test_a_failed_event_skips_the_rest_of_its_lane_only() -> None:
    async def scenario() -> list[str]:
        lanes = KeyLanes(4)
        done: list[str] = []

        def work(name: str, ok: bool):
            async def go() -> bool:
                done.append(name)
                return ok

            return go

        await lanes.submit("a", work("a1", False))
        await lanes.submit("a", work("a2", True))
        await lanes.submit("b", work("b1", True))
        await lanes.drain()
        return done

    assert sorted(run(scenario())) == ["a1", "b1"]


def test_every_skipped_event_is_reported_so_it_can_be_redelivered() -> None:
    async def scenario() -> list[str]:
        lanes = KeyLanes(4)
        skipped: list[str] = []

        def work(ok: bool):
            async def go() -> bool:
                await asyncio.sleep(0.01)
                return ok

            return go

        await lanes.submit("a", work(False))
        await lanes.submit("a", work(True), lambda: skipped.append("a2"))
        await lanes.submit("a", work(True), lambda: skipped.append("a3"))
        await lanes.submit("b", work(True), lambda: skipped.append("b1"))
        await lanes.drain()
        return skipped

    assert run(scenario()) == ["a2", "a3"]


def test_a_work_that_raises_counts_as_not_completed_and_its_key_waits() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        lanes = KeyLanes(4)
        done: list[str] = []
        skipped: list[str] = []

        async def fails() -> bool:
            raise ConnectionError("ack on a closing connection")

        async def succeeds() -> bool:
            done.append("a2")
            return True

        await lanes.submit("a", fails)
        await lanes.submit("a", succeeds, lambda: skipped.append("a2"))
        await lanes.drain()
        return done, skipped

    assert run(scenario()) == ([], ["a2"])


def test_drop_waiting_keeps_each_keys_running_work_and_frees_the_window() -> None:
    async def scenario() -> tuple[int, list[str], int]:
        lanes = KeyLanes(4)
        gate = asyncio.Event()
        done: list[str] = []
        skipped: list[str] = []

        def work(name: str):
            async def go() -> bool:
                await gate.wait()
                done.append(name)
                return True

            return go

        for name in ("a1", "b1", "a2", "b2"):
            await lanes.submit(name[0], work(name), lambda name=name: skipped.append(name))
        await asyncio.sleep(0)
        dropped = lanes.drop_waiting()
        await asyncio.wait_for(lanes.submit("c", work("c1")), 1)
        gate.set()
        await lanes.drain()
        assert not skipped
        return dropped, sorted(done), lanes.busy

    assert run(scenario()) == (2, ["a1", "b1", "c1"], 0)
