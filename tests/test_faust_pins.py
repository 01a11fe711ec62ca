"""What specmeter copies of Faust's private internals (``TablelessManager``): a test that fails
when the faust-streaming release changes them, so the copy is looked at again."""

from __future__ import annotations

import inspect
import textwrap

import pytest

from specmeter.streams.app import FAUST_TABLE_MANAGER_VERSION, _check_table_manager, _table_manager

#: faust-streaming's ``TableManager.on_start`` as ``TablelessManager.on_start`` copies it (less the sleep)
_COPIED_ON_START = '''
async def on_start(self) -> None:
    """Call when table manager is starting."""
    await self.sleep(1.0)
    if not self.should_stop:
        await self._update_channels()
        await self.recovery.start()
'''


def test_faust_table_manager_on_start_is_the_one_copied():
    from faust.tables import TableManager

    source = textwrap.dedent(inspect.getsource(TableManager.on_start))
    assert source.strip() == _COPIED_ON_START.strip(), (
        f"faust-streaming's TableManager.on_start changed since {FAUST_TABLE_MANAGER_VERSION}: "
        f"update TablelessManager (streams/app.py) to match it"
    )
    assert inspect.iscoroutinefunction(TableManager._update_channels)
    assert inspect.iscoroutinefunction(TableManager.on_start)


def test_the_tableless_manager_is_faust_s_less_the_pause():
    from faust.tables import TableManager

    manager = _table_manager()
    assert issubclass(manager, TableManager)
    assert "sleep" not in inspect.getsource(manager.on_start)


def test_a_faust_without_the_private_hook_fails_at_start_up_with_a_clear_error():
    class Changed:  # a TableManager whose private method was renamed
        recovery = None
        should_stop = False

    with pytest.raises(RuntimeError, match=r"TableManager has no _update_channels.*must be updated"):
        _check_table_manager(Changed)


def test_faust_recovery_calls_on_actives_ready_after_resuming_the_partitions():
    """``TablelessManager.on_actives_ready`` takes the records partitions back from Faust's
    delivery and starts the restores: it must come after Faust resumed the partitions."""
    from faust.tables.recovery import Recovery

    source = inspect.getsource(Recovery._resume_streams)  # the path of an app without tables
    resumed = source.find("consumer.resume_partitions(")
    ready = source.find("self.tables.on_actives_ready()")
    assert 0 <= resumed < ready, f"Recovery._resume_streams changed since faust-streaming {FAUST_TABLE_MANAGER_VERSION}"
