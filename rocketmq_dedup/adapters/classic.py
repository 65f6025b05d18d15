"""Conveniences for the classic ``rocketmq-client-python`` (0.5.0rc2 wheel and 2.x).

The listener is already the callback: ``consumer.subscribe(topic, listener)``. It never
raises, which matters: an exception escaping the client's ctypes callback leaves the C side
with an undefined status (observed: the message is acked and lost).
"""

from __future__ import annotations

from typing import Any

from rocketmq_dedup.adapters.clients import check_one_client


def set_name_server(client: Any, address: str) -> None:
    """Set the name server on a producer or consumer of either client version
    (``set_name_server_address`` in 2.x, ``set_namesrv_addr`` in 0.5.0rc2). Raises
    :class:`~rocketmq_dedup.errors.ClientConflictError` when the 5.x client is installed
    beside the classic one (they share the ``rocketmq`` package)."""
    check_one_client()
    for name in ("set_name_server_address", "set_namesrv_addr"):
        setter = getattr(client, name, None)
        if callable(setter):
            setter(address)
            return
    raise TypeError(f"{type(client).__name__} has no name-server setter")
