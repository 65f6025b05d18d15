"""The SampleListener on a classic PushConsumer, deduping on MySQL/MariaDB. Runs until Ctrl-C.

python -m samples.mysql_consumer --host 127.0.0.1 --user app --password ... --database app
"""

from __future__ import annotations

import argparse
import functools
import logging

import MySQLdb

from rocketmq_dedup import DedupConfig, MySQLDedupStore
from samples.rocketmq_clients import consume_until_interrupted
from samples.sample_listener import TEST_TOPIC, SampleListener


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=3306)
    parser.add_argument("--user", required=True)
    parser.add_argument("--password", required=True)
    parser.add_argument("--database", required=True)
    parser.add_argument("--group", default="dedup-sample")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    connect = functools.partial(
        MySQLdb.connect,
        host=args.host,
        port=args.port,
        user=args.user,
        password=args.password,
        database=args.database,
    )
    config = DedupConfig.enable_dedup_consume_config("sample-app", connect)
    assert isinstance(config.persist, MySQLDedupStore)
    config.persist.create_table()
    listener = SampleListener(config)
    consume_until_interrupted("classic", args.group, TEST_TOPIC, listener)


if __name__ == "__main__":
    main()
