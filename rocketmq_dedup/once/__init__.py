"""Dedup for any callable, not only a listener's handler: the listener's decision table, stores,
leases, owner tokens, payload check and metrics, for a block of work or a function.

* :meth:`DedupConfig.once <rocketmq_dedup.DedupConfig.once>` (:class:`Once`): ``with
  config.once(key) as run: if run: ...``, a step inside a handler, a scheduled job;
* :func:`deduplicated`: ``@deduplicated(config, key=lambda order: order.id)`` over a function
  (an HTTP handler, a task): a duplicate raises
  :class:`~rocketmq_dedup.errors.DuplicateConsumedError`;
* :func:`exactly_once`: a function whose writes through a given connection commit with its
  dedup record (the exactly-once mode's databases; an ``async def`` on the asyncio PostgreSQL
  and MySQL stores).

Layout: :mod:`.call` (a call as the strategies see it), :mod:`.strategy` (the listener's
strategies, for one call), :mod:`.registry` (one strategy of each kind per config),
:mod:`.block` (:class:`Once` and what a decided call tells its caller), :mod:`.decorators`.
"""

from rocketmq_dedup.once.block import Once
from rocketmq_dedup.once.call import DEFAULT_ONCE_TOPIC, Call
from rocketmq_dedup.once.decorators import deduplicated, exactly_once, function_topic

__all__ = ["DEFAULT_ONCE_TOPIC", "Call", "Once", "deduplicated", "exactly_once", "function_topic"]
