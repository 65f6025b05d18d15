"""The asyncio memory store: the store contract and the listener cases (the asyncio listener
through the classic push bridge), with no server."""

from __future__ import annotations

import pytest

from rocketmq_dedup.stores.base import DedupStore
from tests.aio_support import bound
from tests.conftest import make_async_store
from tests.shared.aio_failure_cases import *  # noqa: F403
from tests.shared.listener_cases import *  # noqa: F403
from tests.shared.store_contract import *  # noqa: F403


@pytest.fixture
def store(request: pytest.FixtureRequest) -> DedupStore:
    """The asyncio memory store, bound to the test loop."""
    return bound(make_async_store("aio_memory", request))
