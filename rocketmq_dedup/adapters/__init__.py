"""Glue between :class:`~rocketmq_dedup.DedupConcurrentListener` and the RocketMQ clients.

* :mod:`.classic` - ``rocketmq-client-python`` (the ``[rocketmq]`` extra); the listener itself
  is the ``PushConsumer.subscribe`` callback, these are conveniences.
* :mod:`.grpc` - the 5.x ``rocketmq-python-client`` (the ``[rocketmq5]`` extra): a
  ``MessageListener`` for its ``PushConsumer`` and a helper for its ``SimpleConsumer``.

Neither client is imported until an adapter needs it. Both clients in one environment (they
install the same ``rocketmq`` package) are refused when an adapter is used
(:mod:`.clients`, :class:`~rocketmq_dedup.errors.ClientConflictError`).
"""
