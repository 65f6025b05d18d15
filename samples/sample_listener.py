"""The port of the Java SampleListener: on TEST-TOPIC the message body is the dedup key and the
handler pretends to work for 3 seconds."""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

from rocketmq_dedup import DedupConcurrentListener
from rocketmq_dedup.message import message_topic, to_text

logger = logging.getLogger("samples.sample_listener")

TEST_TOPIC = "TEST-TOPIC"


class SampleListener(DedupConcurrentListener):
    """Dedups TEST-TOPIC messages (``topic``) on their body; other topics on their unique id."""

    topic = TEST_TOPIC
    handle_seconds = 3.0

    def dedup_message_key(self, msg: Any) -> Optional[str]:
        if message_topic(msg) == self.topic:
            return to_text(msg.body)
        return super().dedup_message_key(msg)

    def do_handle_msg(self, msg: Any) -> bool:
        if message_topic(msg) == self.topic:
            logger.info("pretending to consume for a long time: %s", to_text(msg.body))
            time.sleep(self.handle_seconds)
        return True
