"""The asyncio stores (Redis standalone, Cluster and Sentinel; PostgreSQL through a factory and
an application's pool; MariaDB through asyncmy): the store contract and the listener cases (the
asyncio listener through the classic push bridge), on the real servers."""

from __future__ import annotations

import pytest

from rocketmq_dedup.stores.base import DedupStore
from tests.aio_support import bound
from tests.conftest import AIO_STORE_KINDS, make_async_store
from tests.shared.aio_failure_cases import *  # noqa: F403
from tests.shared.listener_cases import *  # noqa: F403
from tests.shared.store_contract import *  # noqa: F403

SERVER_KINDS = [kind for kind in AIO_STORE_KINDS if kind != "aio_memory"]


@pytest.fixture(params=SERVER_KINDS)
def store(request: pytest.FixtureRequest) -> DedupStore:
    """Every asyncio server store, bound to the test loop."""
    return bound(make_async_store(request.param, request))
