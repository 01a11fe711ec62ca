"""The worker's timers (``worker.app.add_timer``): mode services added to the Faust app. A
review found the first version ticking through the whole of the app's stop: mode stops a
child service only after its parent's ``on_stop``, where the shell closes, and a tick
then started the routes again behind the close (``_to_start`` saw them cancelled)."""

from __future__ import annotations

import asyncio

import mode

from specmeter.streams.worker.app import add_timer


class _App(mode.Service):
    """A parent whose stop takes a while, as the worker's does (its shell's close)."""

    def __init__(self, stop_s: float) -> None:
        super().__init__()
        self.stop_s = stop_s
        self.ticks: list[float] = []
        self.during_stop = -1

    async def on_stop(self) -> None:
        before = len(self.ticks)
        await asyncio.sleep(self.stop_s)
        self.during_stop = len(self.ticks) - before


def _run(app: _App, started: list[int], run_s: float) -> None:
    async def main() -> None:
        async def tick() -> None:
            app.ticks.append(asyncio.get_running_loop().time())

        add_timer(app, 0.02, tick, "test.tick", on_started=lambda: started.append(1))
        await app.start()
        await asyncio.sleep(run_s)
        await app.stop()

    asyncio.run(main())


def test_ticks_end_as_soon_as_the_app_begins_to_stop():
    app, started = _App(stop_s=0.3), []
    _run(app, started, run_s=0.15)
    assert started == [1], "on_started runs once, as the app starts"
    assert len(app.ticks) >= 3, app.ticks
    assert app.during_stop == 0, f"{app.during_stop} ticks while the app was stopping"


def test_the_first_tick_comes_one_interval_after_the_start():
    app, started = _App(stop_s=0.0), []
    _run(app, started, run_s=0.01)
    assert app.ticks == []
