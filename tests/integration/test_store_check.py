"""The start-up check against the real servers."""

from __future__ import annotations

import redis

from rocketmq_dedup import DedupConfig, MySQLDedupStore
from tests.support import mysql_connect


def test_reachable_stores_pass_the_check(redis_client: redis.Redis, mysql_table: str) -> None:
    """Real Redis and MariaDB pass the start-up check; a missing MySQL table is fine there."""
    assert DedupConfig.enable_dedup_consume_config("app", redis_client).persist is not None
    config = DedupConfig.enable_dedup_consume_config(
        "app", mysql_connect(), table_name="t_not_created_yet"
    )
    assert isinstance(config.persist, MySQLDedupStore)


def test_the_check_leaves_no_probe_record(
    redis_client: redis.Redis, mysql_table: str, app_name: str
) -> None:
    """The start-up check claims probe records in the application's key space through each
    store's writes, and releases them: no Redis key, no live MySQL row is left."""
    DedupConfig.enable_dedup_consume_config(app_name, redis_client)
    assert list(redis_client.scan_iter(match=f"MSGDEDUP:{app_name}:*")) == []
    config = DedupConfig.enable_dedup_consume_config(
        app_name, mysql_connect(), table_name=mysql_table
    )
    assert config.persist is not None
    assert config.persist.stats(app_name).counts == {}
