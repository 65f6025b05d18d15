"""The SampleListener on a classic PushConsumer, deduping on Redis, with its Prometheus
metrics served on http://127.0.0.1:8000/metrics. Runs until Ctrl-C.

python -m samples.redis_consumer --redis redis://127.0.0.1:16379/0 --metrics-port 8000
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
    parser.add_argument("--redis", default="redis://127.0.0.1:16379/0")
    parser.add_argument("--group", default="dedup-sample")
    parser.add_argument("--metrics-port", type=int, default=8000, help="0: no /metrics")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    metrics = None
    if args.metrics_port:
        import prometheus_client  # the [prometheus] extra

        from rocketmq_dedup.metrics import PrometheusMetrics

        metrics = PrometheusMetrics()  # the default registry, served below
        prometheus_client.start_http_server(args.metrics_port, addr="127.0.0.1")
    config = DedupConfig.enable_dedup_consume_config(
        "sample-app",
        redis.Redis.from_url(args.redis),
        dedup_processing_expire_milli_seconds=60_000,
        metrics=metrics,
    )
    listener = SampleListener(config)  # keep a reference for as long as the consumer runs
    consume_until_interrupted("classic", args.group, TEST_TOPIC, listener)


if __name__ == "__main__":
    main()
