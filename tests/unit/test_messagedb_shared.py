"""The reads a Message DB client's bindings share (shared.Fresh): one read serves every caller
that can take it, and a caller that must see what was committed before it asked never gets a
read that started earlier; and the watchers over them (shared.Watch) that wake bindings asleep
until a read shows what they wait for."""

import asyncio
import time

from lbg.broker.messagedb.shared import Fresh, Watch


class Source:
    """Counts its reads; each read returns its number after a short pause."""

    def __init__(self) -> None:
        self.reads = 0
        self.fail = False

    async def read(self) -> int:
        self.reads += 1
        number = self.reads
        await asyncio.sleep(0.01)
        if self.fail:
            raise ConnectionError("down")
        return number


def test_callers_at_once_share_one_read() -> None:
    async def scenario() -> None:
        source = Source()
        fresh = Fresh(source.read)
        since = time.monotonic()
        assert await asyncio.gather(*(fresh.get(since) for _ in range(50))) == [1] * 50
        assert source.reads == 1
        assert await fresh.get(since) == 1  # young enough: no read

    asyncio.run(scenario())


def test_a_caller_asking_for_now_gets_a_read_started_after_it_asked() -> None:
    async def scenario() -> None:
        source = Source()
        fresh = Fresh(source.read)
        early = asyncio.create_task(fresh.get(time.monotonic()))
        await asyncio.sleep(0.002)  # the first read is under way
        assert await fresh.get(time.monotonic()) == 2
        assert await early == 1
        assert await fresh.get(0.0) == 2

    asyncio.run(scenario())


def test_a_failed_read_reaches_every_caller_and_the_next_call_reads_again() -> None:
    async def scenario() -> None:
        source = Source()
        fresh = Fresh(source.read)
        source.fail = True
        since = time.monotonic()
        results = await asyncio.gather(fresh.get(since), fresh.get(since), return_exceptions=True)
        assert all(isinstance(r, ConnectionError) for r in results)
        source.fail = False
        assert await fresh.get(since) == 2

    asyncio.run(scenario())


def test_a_watch_reads_once_a_period_for_every_waiter_and_wakes_each_when_ready() -> None:
    async def scenario() -> None:
        source = Source()
        watch = Watch(Fresh(source.read), 0.05, "test-watch")
        wakes = {n: asyncio.Event() for n in (3, 5, 1000)}
        for n, wake in wakes.items():
            watch.wake_when(lambda read, n=n: read >= n, wake)
        await asyncio.wait_for(wakes[5].wait(), 2)
        assert wakes[3].is_set() and not wakes[1000].is_set()
        assert source.reads <= 6, "not one read per period for all the waiters"
        watch.forget(wakes[1000])
        reads = source.reads
        await asyncio.sleep(0.3)
        assert source.reads <= reads + 1, "still reading with nobody waiting"
        await watch.close()

    asyncio.run(scenario())


def test_a_watch_wakes_every_waiter_when_its_read_fails() -> None:
    async def scenario() -> None:
        source = Source()
        source.fail = True
        watch = Watch(Fresh(source.read), 0.01, "test-watch")
        wakes = [asyncio.Event() for _ in range(3)]
        for wake in wakes:
            watch.wake_when(lambda _read: False, wake)
        await asyncio.wait_for(asyncio.gather(*(w.wait() for w in wakes)), 2)
        await watch.close()

    asyncio.run(scenario())


class Steady:
    """Returns the same value at every read until told another."""

    def __init__(self, value: int) -> None:
        self.value = value

    async def read(self) -> int:
        await asyncio.sleep(0)
        return self.value


def test_a_watch_puts_an_unchanged_read_to_its_waiters_only_once() -> None:
    """An idle category's head reads the same every poll: asking every holder's condition
    again (each client's QC / clients holders, ten times a second) cost a third of an idle
    client's CPU at QC 1024 x 4. A waiter new since, or a changed read, is still judged."""

    async def scenario() -> None:
        source = Steady(7)
        watch = Watch(Fresh(source.read), 0.01, "test-watch")
        asked = {n: 0 for n in range(100)}

        def after(n: int):
            def ready(head: int) -> bool:
                asked[n] += 1
                return head > 7 + n

            return ready

        wakes = {n: asyncio.Event() for n in asked}
        for n, wake in wakes.items():
            watch.wake_when(after(n), wake)
        await asyncio.sleep(0.2)  # many reads of 7
        assert set(asked.values()) == {1}, "an unchanged read was put to every waiter again"
        late = asyncio.Event()
        watch.wake_when(lambda head: head >= 7, late)
        await asyncio.wait_for(late.wait(), 1)
        source.value = 9
        await asyncio.wait_for(wakes[1].wait(), 1)
        assert wakes[0].is_set() and not wakes[2].is_set()
        await watch.close()

    asyncio.run(scenario())


def test_a_fed_watch_reads_nothing_itself_while_reads_come_and_reads_again_once_they_stop() -> None:
    """A heartbeat's statement reads the head too (shared.notify): while those reads come, a
    period apart, the watch judges them and sends no read of its own; once they stop, it
    reads for itself within FED_WITHIN_PERIODS."""

    async def scenario() -> None:
        source = Source()
        period = 0.02
        watch = Watch(Fresh(source.read), period, "test-watch")
        woken = asyncio.Event()
        watch.wake_when(lambda head: head >= 1000, woken)

        async def feed(values: range) -> None:
            for value in values:
                watch.fed(time.monotonic(), value)
                await asyncio.sleep(period)

        await feed(range(100, 110))  # the watch's first read may come before the first feed
        reads = source.reads
        assert reads <= 1
        await feed(range(110, 130))
        assert source.reads == reads, "the watch read for itself while fed"
        assert not woken.is_set()
        await feed(range(1000, 1001))
        await asyncio.wait_for(woken.wait(), 1)
        watch.wake_when(lambda head: head >= 3, woken := asyncio.Event())
        await asyncio.wait_for(woken.wait(), 2)  # the feed stopped: its own reads go on
        assert source.reads >= reads + 2
        await watch.close()

    asyncio.run(scenario())


def test_a_fed_read_wakes_its_waiters_where_it_is_made() -> None:
    """A heartbeat's statement that reads a head a holder waits for wakes that holder in the
    same step, with no turn of the watch's own loop (an idle client's wake-ups are its cost)."""

    async def scenario() -> None:
        watch = Watch(Fresh(Source().read), 0.02, "test-watch")
        woken = asyncio.Event()
        watch.wake_when(lambda head: head >= 1000, woken)
        watch.fed(time.monotonic(), 5)
        assert not woken.is_set()
        watch.fed(time.monotonic(), 1000)
        assert woken.is_set(), "the fed read was judged later, not as it came"
        await watch.close()

    asyncio.run(scenario())
