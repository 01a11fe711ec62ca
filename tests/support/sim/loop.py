"""The virtual event loop each simulated worker runs on: with nothing ready its clock jumps
to the next timer, so that a schedule costs what happens in it, not the time it spans, and
no real clock or I/O makes two runs of a seed differ."""

from __future__ import annotations

import asyncio
import selectors
from typing import Any


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
        #: its tasks not done (``asyncio.all_tasks`` walks every loop's: many in a long run)
        self.tasks: set[asyncio.Task] = set()
        self.set_task_factory(self._task)

    def _task(self, loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task:
        task = asyncio.Task(coro, loop=loop, **kwargs)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def time(self) -> float:
        return self.now

    def run_to(self, when: float) -> None:
        """Run everything due up to ``when`` (virtual seconds)."""
        self.call_at(max(when, self.now), self.stop)
        self.run_forever()
