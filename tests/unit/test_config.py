"""Case 13: bad configuration fails at construction with a clear error; settings work."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import redis

from rocketmq_dedup import (
    DedupConfig,
    DedupConfigError,
    MemoryDedupStore,
    MySQLDedupStore,
    RedisDedupStore,
    StoreFailurePolicy,
)
from rocketmq_dedup.config import MAX_DURATION_MS
from rocketmq_dedup.stores.foreign import ForeignStore
from tests.support import mysql_connect


class FakeConnection:
    """Shaped like a DB-API connection (not a factory of them)."""

    def cursor(self) -> None: ...


REDIS = redis.Redis(port=1)  # never connected: with check_store=False configuration does no I/O


def enable(client: Any, **options: Any) -> DedupConfig:
    options.setdefault("check_store", False)
    return DedupConfig.enable_dedup_consume_config("app", client, **options)


def test_defaults_match_the_java_original() -> None:
    """Lease 60 000 ms, retention 1440 minutes, policy "consume"."""
    config = enable(MemoryDedupStore())
    assert config.dedup_processing_expire_milli_seconds == 60_000
    assert config.dedup_record_reserve_minutes == 1440
    assert (config.lease_ms, config.retention_ms) == (60_000, 86_400_000)
    assert config.store_failure_policy is StoreFailurePolicy.CONSUME


def test_client_kinds_pick_their_store() -> None:
    """Redis client -> RedisDedupStore; connection factory -> MySQLDedupStore; store objects
    are used as they are; duck-typed stores are adapted."""
    assert isinstance(enable(REDIS).persist, RedisDedupStore)
    mysql = enable(mysql_connect(), table_name="my_dedup")
    assert isinstance(mysql.persist, MySQLDedupStore)
    assert mysql.persist.table_name == "my_dedup"
    store = MemoryDedupStore()
    assert enable(store).persist is store

    class Duck:
        def claim(self, *a: Any) -> Any: ...
        def mark_consumed(self, *a: Any) -> Any: ...
        def release(self, *a: Any) -> Any: ...

    assert isinstance(enable(Duck()).persist, ForeignStore)


def test_settings_are_attributes_and_accept_floats() -> None:
    """The Java setters are attributes; float values are accepted and converted to ms."""
    config = enable(MemoryDedupStore(), dedup_processing_expire_milli_seconds=1500.4)
    config.dedup_record_reserve_minutes = 0.5
    config.store_failure_policy = "reconsume_later"  # type: ignore[assignment]
    assert (config.lease_ms, config.retention_ms) == (1500, 30_000)
    assert config.store_failure_policy is StoreFailurePolicy.RECONSUME_LATER


@pytest.mark.parametrize(
    ("client", "options", "message"),
    [
        (None, {}, "client is None"),
        (object(), {}, "unsupported client"),
        ("redis://127.0.0.1", {}, "unsupported client"),
        (FakeConnection(), {}, "unsupported client"),  # a connection, not a factory
        (REDIS, {"dedup_processing_expire_milli_seconds": 0}, "positive"),
        (REDIS, {"dedup_processing_expire_milli_seconds": -5}, "positive"),
        (REDIS, {"dedup_processing_expire_milli_seconds": float("nan")}, "positive"),
        (REDIS, {"dedup_record_reserve_minutes": 0}, "positive"),
        (REDIS, {"dedup_record_reserve_minutes": "10"}, "must be a number"),
        (REDIS, {"dedup_record_reserve_minutes": True}, "must be a number"),
        (REDIS, {"store_failure_policy": "drop"}, "store_failure_policy"),
        (REDIS, {"table_name": "t"}, "table_name do not apply to RedisDedupStore"),
        (REDIS, {"lease": 5}, "unknown option"),
        (functools.partial(int), {"table_name": "t; DROP TABLE x"}, "invalid table_name"),
        (functools.partial(int), {"table_name": ""}, "invalid table_name"),
        (functools.partial(int), {"key_prefix": "x"}, "key_prefix do not apply to MySQL"),
        (MemoryDedupStore(), {"key_prefix": "x"}, "do not apply to a store object"),
        (redis.Redis, {}, "redis.client.Redis"),  # the class, not a client
        (REDIS, {"lease_renewal": "false"}, "lease_renewal must be True or False"),
        (REDIS, {"lease_renewal": 0}, "lease_renewal must be True or False"),
        (REDIS, {"dedup_processing_expire_milli_seconds": 1e20}, "at most"),
        (REDIS, {"dedup_record_reserve_minutes": 1e17}, "at most"),
        (REDIS, {"max_processing_milli_seconds": 1e20}, "at most"),
        (REDIS, {"check_store": "no"}, "check_store must be True or False"),
        (REDIS, {"payload_mismatch": "drop"}, "payload_mismatch must be one of"),
    ],
)
def test_bad_configuration_fails_at_construction(client: Any, options: Any, message: str) -> None:
    """Each bad setting raises DedupConfigError naming the problem."""
    with pytest.raises(DedupConfigError, match=message):
        enable(client, **options)


def test_bad_setting_assigned_later_fails_at_assignment() -> None:
    """Assigning an invalid value to a setting raises at once and keeps the old value."""
    config = enable(MemoryDedupStore())
    with pytest.raises(DedupConfigError):
        config.dedup_processing_expire_milli_seconds = 0
    assert config.lease_ms == 60_000


def test_application_name_is_required() -> None:
    """An empty application name is rejected."""
    with pytest.raises(DedupConfigError, match="application_name"):
        DedupConfig.enable_dedup_consume_config("", MemoryDedupStore())


def test_disabled_config_has_no_store() -> None:
    """disable_dedup_consume_config -> enabled False and no store."""
    config = DedupConfig.disable_dedup_consume_config("app")
    assert (config.enabled, config.persist) == (False, None)


def test_longest_durations_are_accepted() -> None:
    """100 years is the bound: accepted for every duration, in whole milliseconds."""
    config = enable(
        MemoryDedupStore(),
        dedup_processing_expire_milli_seconds=MAX_DURATION_MS,
        dedup_record_reserve_minutes=MAX_DURATION_MS / 60_000,
        max_processing_milli_seconds=MAX_DURATION_MS,
    )
    assert config.lease_ms == config.retention_ms == config.max_processing_ms == MAX_DURATION_MS


@pytest.mark.parametrize("kind", ["redis", "mysql"])
def test_unreachable_store_fails_at_construction_naming_its_address(kind: str) -> None:
    """check_store (the default): a store that is not there is a DedupConfigError naming it."""
    client = redis.Redis(host="127.0.0.1", port=1) if kind == "redis" else mysql_connect(port=1)
    with pytest.raises(DedupConfigError, match=r"127\.0\.0\.1:1\b.*check_store=False"):
        DedupConfig.enable_dedup_consume_config("app", client)


def test_check_store_false_starts_without_the_store() -> None:
    """check_store=False builds the config without reaching the store."""
    config = DedupConfig.enable_dedup_consume_config("app", REDIS, check_store=False)
    assert isinstance(config.persist, RedisDedupStore)


def test_bad_option_is_reported_before_the_store_is_reached() -> None:
    """Options are validated first: a bad option is named even when the store is down."""
    with pytest.raises(DedupConfigError, match="store_failure_policy"):
        DedupConfig.enable_dedup_consume_config("app", REDIS, store_failure_policy="drop")


def test_config_closes_as_a_context_manager() -> None:
    """``with config:`` closes its store on exit."""
    closed = []

    class Store(MemoryDedupStore):
        def close(self) -> None:
            closed.append(True)

    with enable(Store()) as config:
        assert config.persist is not None
    assert closed == [True]
