"""The SampleListener on a classic PushConsumer, deduping on Redis. Runs until Ctrl-C.

python -m samples.redis_consumer --namesrv 127.0.0.1:9876 --redis redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import logging

import redis

from rocketmq_dedup import DedupConfig
from samples.rocketmq_clients import consume_until_interrupted
from samples.sample_listener import TEST_TOPIC, SampleListener


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--group", default="dedup-sample")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    config = DedupConfig.enable_dedup_consume_config(
        "sample-app", redis.Redis.from_url(args.redis), dedup_processing_expire_milli_seconds=60_000
    )
    listener = SampleListener(config)  # keep a reference for as long as the consumer runs
    consume_until_interrupted("classic", args.group, TEST_TOPIC, listener)


if __name__ == "__main__":
    main()
