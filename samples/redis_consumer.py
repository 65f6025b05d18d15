"""The SampleListener on a classic PushConsumer, deduping on Redis, with its Prometheus
metrics served on http://127.0.0.1:8000/metrics (what the operator kit in rocketmq_dedup/ops
watches: the alerting rules and the Grafana dashboard). Runs until Ctrl-C.

python -m samples.redis_consumer --redis redis://127.0.0.1:16379/0 --metrics-port 8000

A message with a key is deduped on its first key, and its body is the payload checked against
the first copy's (a key reused with another body is counted as ``payload_mismatch``); one
without a key on its body, as the Java sample does. ``--fail-body TEXT``: a message with that
body fails in its handler on every delivery (a poisoned message, to watch the alert for messages
heading to the DLQ).
"""

from __future__ import annotations

import argparse
import logging
from typing import Any, Optional

import redis

from rocketmq_dedup import DedupConfig
from rocketmq_dedup.message import message_body, message_keys
from samples.rocketmq_clients import consume_until_interrupted
from samples.sample_listener import TEST_TOPIC, SampleListener

logger = logging.getLogger("samples.redis_consumer")


class KeyedSampleListener(SampleListener):
    """SampleListener, keyed on the message's first key when it has one, checking payloads;
    a message whose body is ``fail_body`` fails in its handler."""

    fail_body: Optional[bytes] = None

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        keys = message_keys(msg)
        return keys[0] if keys else super().dedup_message_key(msg)

    def payload_fingerprint(self, msg: Any) -> bytes:
        return message_body(msg)

    def do_handle_msg(self, msg: Any) -> bool:
        if self.fail_body is not None and message_body(msg) == self.fail_body:
            logger.warning("failing on purpose: %s", self.fail_body.decode("utf-8", "replace"))
            return False  # retried by the broker, and again, until the DLQ
        return super().do_handle_msg(msg)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis", default="redis://127.0.0.1:16379/0")
    parser.add_argument("--group", default="dedup-sample")
    parser.add_argument("--topic", default=TEST_TOPIC)
    parser.add_argument("--app", default="sample-app", help="the application name")
    parser.add_argument("--metrics-port", type=int, default=8000, help="0: no /metrics")
    parser.add_argument("--handle-seconds", type=float, default=SampleListener.handle_seconds)
    parser.add_argument("--lease-ms", type=int, default=60_000, help="the CONSUMING lease")
    parser.add_argument("--threads", type=int, default=4, help="consumer threads")
    parser.add_argument("--fail-body", help="messages with this body fail in their handler")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    metrics = None
    if args.metrics_port:
        import prometheus_client  # the [prometheus] extra

        from rocketmq_dedup.metrics import PrometheusMetrics

        metrics = PrometheusMetrics()  # the default registry, served below
        prometheus_client.start_http_server(args.metrics_port, addr="127.0.0.1")
    config = DedupConfig.enable_dedup_consume_config(
        args.app,
        redis.Redis.from_url(args.redis),
        dedup_processing_expire_milli_seconds=args.lease_ms,
        metrics=metrics,
    )
    listener = KeyedSampleListener(config)  # keep a reference for as long as the consumer runs
    listener.topic, listener.handle_seconds = args.topic, args.handle_seconds
    listener.fail_body = args.fail_body.encode() if args.fail_body else None
    consume_until_interrupted("classic", args.group, args.topic, listener, args.threads)


if __name__ == "__main__":
    main()
