"""pytest fixtures for testing a dedup listener without a broker or a server.

Installed with the package (its ``pytest11`` entry point): nothing to configure, and
``-p no:rocketmq_dedup.pytest_plugin`` turns it off. The library is imported only when a test
uses a fixture.

* ``dedup_clock``: a :class:`~rocketmq_dedup.testing.ManualClock` at 0 that the test moves.
* ``dedup_store``: a :class:`~rocketmq_dedup.MemoryDedupStore` whose leases and retentions
  read ``dedup_clock``.
* ``make_dedup_listener(listener_class, *args, application_name="test-app", **settings)``:
  ``listener_class(config, *args)`` on a new config over ``dedup_store`` (``settings`` are
  :class:`~rocketmq_dedup.DedupConfig`'s, e.g. ``lease_renewal=False``); every listener it made
  is closed when the test ends, so none leaves a lease-renewal thread behind. Two listeners made
  in one test share the store: two consumers of one application.

A test::

    def test_a_copy_is_acked_without_the_handler(make_dedup_listener, dedup_clock):
        listener = make_dedup_listener(OrderListener)
        assert deliver(listener, ClassicMessage("m1"), times=2).handler_runs == 1
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, List, Type, TypeVar

import pytest

if TYPE_CHECKING:
    from rocketmq_dedup.listener import BaseDedupListener
    from rocketmq_dedup.stores.memory import MemoryDedupStore
    from rocketmq_dedup.testing import ManualClock

L = TypeVar("L", bound="BaseDedupListener")

#: The application name of the listeners ``make_dedup_listener`` makes, unless told.
TEST_APPLICATION = "test-app"


class ListenerFactory:
    """``make_dedup_listener``: builds listeners on one store and closes them all at the end."""

    def __init__(self, store: MemoryDedupStore) -> None:
        self.store = store
        self.made: List[BaseDedupListener] = []

    def __call__(
        self,
        listener_class: Type[L],
        *args: Any,
        application_name: str = TEST_APPLICATION,
        **settings: Any,
    ) -> L:
        """``listener_class(config, *args)`` with dedup on this factory's store."""
        from rocketmq_dedup.config import DedupConfig

        config = DedupConfig.enable_dedup_consume_config(application_name, self.store, **settings)
        listener = listener_class(config, *args)
        self.made.append(listener)
        return listener

    def close(self) -> None:
        """Close every listener made (their lease renewal stops; their store stays)."""
        while self.made:
            self.made.pop().close()


@pytest.fixture
def dedup_clock() -> ManualClock:
    """A clock at 0 that moves only on ``dedup_clock.advance(seconds)``."""
    from rocketmq_dedup.testing import ManualClock

    return ManualClock()


@pytest.fixture
def dedup_store(dedup_clock: ManualClock) -> MemoryDedupStore:
    """A memory store whose leases and retentions read ``dedup_clock``."""
    from rocketmq_dedup.stores.memory import MemoryDedupStore

    return MemoryDedupStore(clock=dedup_clock)


@pytest.fixture
def make_dedup_listener(dedup_store: MemoryDedupStore) -> Iterator[ListenerFactory]:
    """Makes listeners on ``dedup_store``; closes them when the test ends."""
    factory = ListenerFactory(dedup_store)
    yield factory
    factory.close()
