"""The exception hierarchy: everything the library raises derives from :class:`DedupError`."""

from __future__ import annotations


class DedupError(Exception):
    """Base class of every error raised by rocketmq-dedup."""


class DedupConfigError(DedupError, ValueError):
    """A configuration is invalid; raised at construction, never at the first message."""


class StoreError(DedupError):
    """The dedup record store could not do an operation, for a reason that is not an outage: a
    missing table, a driver used in a way the store does not support, a bug. The listener logs
    it at ERROR and answers RECONSUME_LATER (never "consume without dedup").

    The original exception is chained as ``__cause__``.
    """


class StoreUnavailableError(StoreError):
    """The store is unreachable or failed as a server: connection refused or lost, a timeout,
    a server-side error (PEP 249 ``OperationalError``/``InterfaceError``; redis-py
    ``ConnectionError``, ``TimeoutError`` and error replies). The listener applies the
    config's ``store_failure_policy``."""


class StoreMisconfiguredError(StoreError):
    """The store refused an operation for a reason that will not pass by itself: a person must
    fix the configuration. The account lacks a privilege (MySQL/MariaDB 1142 "INSERT command
    denied", 1044/1045 access denied) or an ACL rule (Redis ``NOPERM``), or the server takes no
    writes (a MariaDB in ``read_only`` mode, 1290; a Redis replica, ``READONLY``). Never an
    outage: the listener logs it at ERROR and answers RECONSUME_LATER whatever
    ``store_failure_policy`` says (running handlers without dedup until someone notices would
    apply duplicates). The start-up check raises it (as :class:`DedupConfigError`) before the
    first message.

    ``fix`` says what to change (the privilege to grant, the ACL rule, the server to point at);
    the message ends with it. The driver's error is chained as ``__cause__``.
    """

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(f"{message} ({fix})")
        self.fix = fix


class StorePoolExhaustedError(StoreError):
    """No connection of the store's pool came free in time: all of the MySQL store's
    ``pool_size`` connections stayed busy for ``pool_timeout``, or the bounded pool of a
    redis-py client (``max_connections``) had none to give. The server is not known to be down,
    so this is not an outage: the listener logs it and answers RECONSUME_LATER whatever
    ``store_failure_policy`` says (running handlers without dedup because a consumer's threads
    outnumber its connections would apply messages twice). Size the pool for the consumer's
    threads; the original error, if any, is chained as ``__cause__``."""


class StoreLockConflictError(StoreError):
    """A statement of the dedup layer waited too long for a lock another session holds, or was
    chosen as a deadlock's victim (MySQL/MariaDB 1205 and 1213): two copies of a message, or two
    steps of one entity, met in the database. The server is up, so this is not an outage: the
    listener answers RECONSUME_LATER (the other transaction goes on), logs it as what it is and
    counts it apart (outcome ``lock_conflict``). Chained to the driver's error."""


class PermanentFailure(DedupError):
    """Raised (or returned) by ``do_handle_msg`` when its message can never succeed (an invalid
    payload, a business rule it breaks): retrying it would only fail again, 16 times over hours.

    The listener records the message FAILED with ``reason`` (its first
    :data:`~rocketmq_dedup.stores.base.MAX_REASON_LENGTH` characters; the exception's class name
    when empty) for the retention, logs it, counts it (outcome ``permanent_failure``) and
    answers as the ``permanent_failure`` setting says: RECONSUME_LATER until the broker
    dead-letters it (``"dlq"``, the default) or CONSUME_SUCCESS (``"ack"``). A copy of the
    message is answered the same way without the handler; ``rocketmq-dedup inspect`` shows the
    reason. No local retry runs after it. In the exactly-once mode the handler's writes are
    rolled back and the FAILED record alone is committed.

    ``raise PermanentFailure("amount must be positive") from exc`` keeps the cause in the log.
    """

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason)
        self.reason = str(reason)


class TransactionMisuseError(DedupError):
    """An exactly-once handler tried to end or reconfigure the transaction it was given
    (``commit()``, ``rollback()``, ``close()``, autocommit, a reconnecting ``ping``), or left its
    session unfit to commit: in autocommit mode, or not the session the transaction began on (a
    reconnect). The listener rolls the transaction back, answers RECONSUME_LATER, and never
    gives that connection to another message."""


class BrokerError(DedupError):
    """The RocketMQ name server or broker could not be reached, or refused a request of the
    operator's dead-letter tool (``rocketmq-dedup dlq``): the message says which and why."""


class MissingExtraError(DedupError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(f"{module!r} is not installed: pip install 'rocketmq-dedup[{extra}]'")
        self.module = module
        self.extra = extra


class ClientConflictError(DedupError, ImportError):
    """Both RocketMQ clients are installed in one environment: the classic
    ``rocketmq-client-python`` (``[rocketmq]``) and the 5.x ``rocketmq-python-client``
    (``[rocketmq5]``) install the same top-level package ``rocketmq`` over each other, so
    neither is whole. Raised when an adapter is used; the message says which one's files the
    shared package now has and how to get back to one client."""
