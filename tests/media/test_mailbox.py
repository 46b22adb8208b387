"""The newest-item mailbox: replacement counted with its reason, hand-over between threads and to a task."""

import asyncio
import threading

from app.media.mailbox import Mailbox


def test_keeps_only_the_newest_and_counts_what_it_replaces() -> None:
    seen: list[tuple[str, int]] = []
    box: Mailbox[int] = Mailbox(on_drop=lambda reason, count: seen.append((reason, count)))
    assert box.take() is None and not box.has_item
    assert box.put(1) is False
    assert box.put(2) is True
    assert box.put(3, reason="output_superseded") is True
    assert box.has_item
    assert box.take() == 3
    assert box.take() is None
    assert dict(box.drops) == {"superseded": 1, "output_superseded": 1}
    assert box.dropped == 2
    assert seen == [("superseded", 1), ("output_superseded", 1)]


def test_discard_counts_only_with_a_reason_and_later_losses_are_counted_too() -> None:
    box: Mailbox[str] = Mailbox()
    box.put("a")
    box.discard()
    assert not box.has_item and box.dropped == 0
    box.discard("closed")  # nothing waiting: nothing lost
    assert box.dropped == 0
    box.put("b")
    box.discard("closed")
    box.count_drop("encoder_busy", 3)
    assert dict(box.drops) == {"closed": 1, "encoder_busy": 3}


def test_a_thread_waiting_on_the_shared_condition_gets_the_newest_item() -> None:
    cond = threading.Condition()
    box: Mailbox[int] = Mailbox(cond=cond)
    got: list[int] = []
    stop = False

    def consume() -> None:
        while True:
            with cond:
                while not box.has_item and not stop:
                    cond.wait()
                item = box.take()
                if item is None:
                    return
            got.append(item)

    consumer = threading.Thread(target=consume)
    with cond:  # the consumer cannot take anything before all three are put
        consumer.start()
        for item in (1, 2, 3):
            box.put(item)
    consumer.join(0.5)
    with cond:
        stop = True
        box.wake()
    consumer.join(5)
    assert not consumer.is_alive()
    assert got == [3] and box.dropped == 2


def test_a_task_is_woken_by_put_and_by_wake() -> None:
    async def run() -> list[str]:
        box: Mailbox[str] = Mailbox(wakes_loop=True)
        events: list[str] = []

        async def consume() -> None:
            while True:
                await box.wait_async()
                item = box.take()
                events.append(item if item is not None else "woken")
                if item is None:
                    return

        task = asyncio.create_task(consume())
        await asyncio.sleep(0)
        box.put("frame")
        await asyncio.sleep(0)
        box.wake()
        await asyncio.wait_for(task, 5)
        return events

    assert asyncio.run(run()) == ["frame", "woken"]
