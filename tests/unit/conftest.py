"""The unit layer: ``store`` runs on the memory store and on a user's duck-typed store through
the adapter. Nothing here connects to a server (``pytest tests/unit`` passes with none)."""

from __future__ import annotations

import pytest

from rocketmq_dedup.stores.base import DedupStore
from tests.conftest import make_store

STORE_KINDS = ["memory", "foreign"]


@pytest.fixture(params=STORE_KINDS)
def store(request: pytest.FixtureRequest) -> DedupStore:
    """Every in-process store kind."""
    return make_store(request.param, request)
