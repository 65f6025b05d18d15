"""The MySQL store's pool of statement runners (:mod:`.connection`): the SQL stores' bounded,
fork-safe pool (:mod:`rocketmq_dedup.stores.pool`), which retries once after a lost connection
(:func:`~.errors.is_connection_error`)."""

from __future__ import annotations

from typing import Callable, Optional

from rocketmq_dedup.stores.mysql.connection import Runner
from rocketmq_dedup.stores.mysql.errors import is_connection_error
from rocketmq_dedup.stores.pool import BoundedPool


class ConnectionPool(BoundedPool[Runner]):
    """The MySQL store's pool of statement runners (see
    :class:`~rocketmq_dedup.stores.pool.BoundedPool`)."""

    def __init__(
        self,
        open_runner: Callable[[], Runner],
        size: int,
        timeout: float,
        describe: Optional[Callable[[], str]] = None,
    ) -> None:
        super().__init__(open_runner, size, timeout, "MySQL", is_connection_error, describe)


__all__ = ["ConnectionPool"]
