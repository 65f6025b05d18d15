"""Deduplicated calls: a payment charged once per order by whatever calls it (an HTTP endpoint,
a scheduled job, a consumer), and a receipt e-mailed once, a step a retried handler may reach
again; both on the same Redis records as the order consumer of the quick starts.

    pip install 'rocketmq-dedup[redis]'
    python deduplicated_calls.py order-1 order-2 order-1

Environment (the default is the server scripts/services.sh starts):
    REDIS_URL          where the records live    redis://127.0.0.1:16379/0
"""

import logging
import os
import sys
from typing import Callable, Tuple

import redis

from rocketmq_dedup import DedupConfig, DuplicateConsumedError, deduplicated

logger = logging.getLogger("payments")


def payment_steps(config: DedupConfig) -> Tuple[Callable[[str, int], str], Callable[[str], None]]:
    """The two deduplicated steps on ``config``'s store."""

    @deduplicated(config, key=lambda order_id, amount: order_id, topic="payments")
    def charge(order_id: str, amount: int) -> str:  # runs once per order id
        logger.info("order %s charged %d", order_id, amount)
        return f"receipt-{order_id}"

    def charge_once(order_id: str, amount: int) -> str:
        try:
            return charge(order_id, amount)
        except DuplicateConsumedError:  # charged before: by this call, another, a consumer
            logger.info("order %s: already charged, skipped", order_id)
            return "already charged"

    def email_receipt(order_id: str) -> None:  # a step inside a handler
        with config.once(f"{order_id}:receipt-email") as run:
            if run:  # a with body always runs: test run before the work
                logger.info("order %s: receipt e-mailed", order_id)

    return charge_once, email_receipt


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    config = DedupConfig.enable_dedup_consume_config(
        "order-service",
        redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:16379/0")),
    )
    charge_once, email_receipt = payment_steps(config)
    with config:
        for order_id in sys.argv[1:]:
            charge_once(order_id, 10)
            email_receipt(order_id)


if __name__ == "__main__":
    main()
