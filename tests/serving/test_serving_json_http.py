"""The REST apps' request threads: a call runs on one of the pool's threads while the event loop goes on, its
result or exception comes back to the awaiting coroutine, at most `count` calls run at once, and a closed pool
refuses new calls."""
import asyncio
import threading

import pytest

from tftrt_py.serving.json_http import RequestThreads


def test_a_call_runs_off_the_event_loop_and_returns_its_result():
    threads = RequestThreads(2)

    async def main():
        loop_thread = threading.get_ident()
        ran_on, total = await threads.run(lambda a, b: (threading.get_ident(), a + b), 2, 3)
        assert total == 5 and ran_on != loop_thread

    try:
        asyncio.run(main())
    finally:
        threads.close()


def test_an_exception_reaches_the_caller():
    threads = RequestThreads(1)

    def fail():
        raise ValueError("bad body")

    try:
        with pytest.raises(ValueError, match="bad body"):
            asyncio.run(threads.run(fail))
    finally:
        threads.close()


def test_at_most_count_calls_run_at_once():
    threads, lock, running, most = RequestThreads(3), threading.Lock(), [0], [0]
    release = threading.Event()

    def work():
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        release.wait(5)
        with lock:
            running[0] -= 1

    async def main():
        calls = [asyncio.ensure_future(threads.run(work)) for _ in range(8)]
        await asyncio.sleep(0.2)  # every thread the pool may start has taken a call by now
        release.set()
        await asyncio.gather(*calls)

    try:
        asyncio.run(main())
    finally:
        threads.close()
    assert most[0] == 3


def test_a_closed_pool_refuses_calls():
    threads = RequestThreads(1)
    threads.close()
    with pytest.raises(RuntimeError):
        asyncio.run(threads.run(print))
