"""A consumer process whose handler kills it (SIGKILL, as an OOM kill or a native fault would):
the child of tests/integration/test_poison_messages.py. It delivers one message to a
``DedupConcurrentListener`` on a real store, with ``max_lapsed_claims`` set; if the listener
answers without running the handler (the message parked), it prints its answer as JSON and
exits 0; else the handler kills the process before it can print anything.

    python -m tests.integration.poison_consumer STORE TABLE APP KEY MAX_LAPSED_CLAIMS

STORE is ``redis`` or ``mysql`` or ``postgres`` (the servers of tests/support.py); TABLE the
SQL table (ignored on Redis)."""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any

import redis

from rocketmq_dedup import DedupConcurrentListener, DedupConfig
from rocketmq_dedup.testing import ClassicMessage
from tests.support import REDIS_URL, mysql_connect, pg_connect

#: The CONSUMING lease: short, so that each dead consumer's claim lapses soon.
LEASE_MS = 500


class PoisonedListener(DedupConcurrentListener):
    """Its handler ends the process, as a message that makes it run out of memory would."""

    def do_handle_msg(self, msg: Any) -> bool:
        os.kill(os.getpid(), signal.SIGKILL)
        return True  # never reached


def main() -> None:
    kind, table, app, key, most = sys.argv[1:6]
    client: Any = redis.Redis.from_url(REDIS_URL)
    options: dict[str, Any] = {}
    if kind == "mysql":
        client, options = mysql_connect(), {"table_name": table}
    elif kind == "postgres":
        client, options = pg_connect(), {"table_name": table}
    config = DedupConfig.enable_dedup_consume_config(
        app,
        client,
        dedup_processing_expire_milli_seconds=LEASE_MS,
        max_lapsed_claims=int(most),
        **options,
    )
    with PoisonedListener(config) as listener:
        answer = listener(ClassicMessage(key))
    print(json.dumps({"answer": answer.name}))


if __name__ == "__main__":
    main()
