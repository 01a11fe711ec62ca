"""The virtual event loop each simulated worker runs on: with nothing ready its clock jumps
to the next timer, so that a schedule costs what happens in it, not the time it spans, and
no real clock or I/O makes two runs of a seed differ."""

# ruff: noqa: SLF001 - a subclass of asyncio's loop, running its handles as its own loop does
from __future__ import annotations

import asyncio
import heapq
import selectors
from asyncio import events
from typing import Any

#: asyncio's own thresholds for purging cancelled timers (``base_events``), kept so that a
#: schedule's timers run in the very order asyncio's loop would run them
_MIN_SCHEDULED = 100
_MIN_CANCELLED_FRACTION = 0.5


class _NoSelector(selectors.BaseSelector):
    """A selector without I/O: waiting ``timeout`` moves the loop's virtual clock on."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.loop: VirtualLoop | None = None

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data)
        self._map[fileobj] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._map.pop(fileobj)

    def select(self, timeout: float | None = None) -> list:
        if timeout and self.loop is not None:
            self.loop.now += timeout
        return []

    def get_map(self) -> Any:
        return self._map

    def close(self) -> None:
        self._map.clear()


class VirtualLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock is virtual: with nothing ready it jumps to the next timer."""

    def __init__(self) -> None:
        selector = _NoSelector()
        self.now = 0.0
        super().__init__(selector)
        selector.loop = self
        #: the tasks it ran, in the order they began (``asyncio.all_tasks`` walks every
        #: loop's: many in a long run); no done callback drops them, as that would be a
        #: callback more for every task the worker runs, on a path that is mostly tasks
        self.tasks: list[asyncio.Task] = []
        #: the virtual time ``run_to`` runs to (None: not running to a time)
        self._stop_at: float | None = None
        self.set_task_factory(self._task)

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.append(task)
        return task

    def pending(self) -> list[asyncio.Task]:
        """Its tasks not done, in the order they began."""
        self.tasks = [task for task in self.tasks if not task.done()]
        return self.tasks

    def time(self) -> float:
        return self.now

    # asyncio's loop, less what a loop without I/O, threads or debug mode never needs: no
    # self-pipe (a socket pair per loop), no checks per callback, no stop timer per run.
    # Callbacks run in asyncio's own order, with one difference from a stop timer in the
    # heap: timers due at the same instant may pop in another order than beside it. A
    # seed still replays exactly (the trace digest of seeds 0-199 was unchanged).

    def _make_self_pipe(self) -> None:
        self._ssock = self._csock = None

    def _close_self_pipe(self) -> None:
        pass

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        if self._closed:
            raise RuntimeError("Event loop is closed")
        handle = events.Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
        if self._closed:
            raise RuntimeError("Event loop is closed")
        timer = events.TimerHandle(when, callback, args, self, context)
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def _run_once(self) -> None:
        """``BaseEventLoop._run_once`` with the selector's wait made a jump of the clock."""
        scheduled, ready = self._scheduled, self._ready
        if len(scheduled) > _MIN_SCHEDULED and self._timer_cancelled_count / len(scheduled) > _MIN_CANCELLED_FRACTION:
            kept = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    kept.append(handle)
            heapq.heapify(kept)
            self._scheduled = scheduled = kept
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)._scheduled = False
        stop_at = self._stop_at
        if not ready and not self._stopping and (scheduled or stop_at is not None):
            due = scheduled[0]._when if scheduled else stop_at
            if stop_at is not None and stop_at < due:
                due = stop_at
            timeout = min(max(0, due - self.now), 86400)
            if timeout:
                self.now += timeout
        end_time = self.now + self._clock_resolution
        while scheduled and scheduled[0]._when < end_time:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        if stop_at is not None and stop_at < end_time:  # run_to's end: after this turn's callbacks
            self._stopping, self._stop_at = True, None
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()
        handle = None

    def run_to(self, when: float) -> None:
        """Run everything due up to ``when`` (virtual seconds): the turn in which the clock
        reaches it is the last (as a ``stop`` timer at ``when`` would end it, without one)."""
        self._stop_at = max(when, self.now)
        try:
            self.run_forever()
        finally:
            self._stop_at = None
