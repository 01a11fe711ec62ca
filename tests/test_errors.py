"""The worker's and its tools' own errors share one base (issue #22): a caller catches
``SpecmeterError`` for all of them, or the built-in kind each one also is."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import click

import specmeter.streams
from specmeter.streams import SpecmeterError


def _error_classes() -> list[type]:
    found = []
    for module in pkgutil.walk_packages(specmeter.streams.__path__, "specmeter.streams."):
        if module.name.endswith("__main__"):  # runs a command line when imported
            continue
        loaded = importlib.import_module(module.name)
        for _, obj in inspect.getmembers(loaded, inspect.isclass):
            if obj.__module__ == loaded.__name__ and issubclass(obj, BaseException):
                found.append(obj)
    return found


def test_every_error_the_streams_package_defines_is_a_specmeter_error():
    errors = _error_classes()
    assert len(errors) >= 8, errors
    # a signal that ends a command (SIGTERM, handled where Ctrl-C is) is no error: it must
    # pass every ``except Exception`` as KeyboardInterrupt does
    signals = [e for e in errors if not issubclass(e, Exception)]
    assert all(issubclass(e, KeyboardInterrupt) for e in signals), signals
    errors = [e for e in errors if e not in signals]
    own = [e for e in errors if not issubclass(e, click.ClickException)]  # the CLI's way of printing them
    assert own and all(issubclass(e, SpecmeterError) for e in own), [
        e for e in own if not issubclass(e, SpecmeterError)
    ]


def test_each_is_also_the_built_in_kind_it_is():
    from specmeter.streams.cli.preflight import BrokerUnreachable, PortInUse
    from specmeter.streams.readers.topic_lookup import TopicNotFound
    from specmeter.streams.worker.topics import TopicsNotCreated

    assert issubclass(BrokerUnreachable, ConnectionError) and BrokerUnreachable.retriable
    assert issubclass(PortInUse, OSError) and issubclass(TopicNotFound, LookupError)
    refused = TopicsNotCreated("the cluster refused to create 'x'", "pass a smaller --replication-factor")
    assert isinstance(refused, SpecmeterError) and isinstance(refused, RuntimeError)
    assert refused.fix == "pass a smaller --replication-factor"
