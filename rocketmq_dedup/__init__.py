"""Consumer-side message deduplication for RocketMQ Python consumers.

A port of the Java RocketMQDedupListener: subclass :class:`DedupConcurrentListener`, implement
``do_handle_msg``, give it a :class:`DedupConfig` with a Redis, MySQL or PostgreSQL store, and
subscribe it.
For handlers that write to MySQL/MariaDB, :class:`TransactionalDedupListener` commits their
writes and the dedup record in one transaction (exactly once).
"""

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import (
    DedupConfigError,
    DedupError,
    MissingExtraError,
    StoreError,
    StorePoolExhaustedError,
    StoreUnavailableError,
    TransactionMisuseError,
)
from rocketmq_dedup.listener import BaseDedupListener, DedupConcurrentListener
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.status import (
    ConsumeStatus,
    DedupStatus,
    ExactlyOnceClaim,
    Outcome,
    PayloadMismatch,
    SequenceMode,
    StoreFailurePolicy,
)
from rocketmq_dedup.stores import (
    Claim,
    ClaimResult,
    DedupStore,
    MemoryDedupStore,
    MySQLDedupStore,
    PostgresDedupStore,
    Record,
    RedisDedupStore,
)
from rocketmq_dedup.strategy import BatchResult
from rocketmq_dedup.transactional import TransactionalDedupListener

__version__ = "0.1.0"

__all__ = [
    "BaseDedupListener",
    "BatchResult",
    "Claim",
    "ClaimResult",
    "ConsumeStatus",
    "DedupConcurrentListener",
    "DedupConfig",
    "DedupConfigError",
    "DedupElement",
    "DedupError",
    "DedupStatus",
    "DedupStore",
    "ExactlyOnceClaim",
    "MemoryDedupStore",
    "MissingExtraError",
    "MySQLDedupStore",
    "Outcome",
    "PayloadMismatch",
    "PostgresDedupStore",
    "Record",
    "RedisDedupStore",
    "SequenceMode",
    "StoreError",
    "StoreFailurePolicy",
    "StorePoolExhaustedError",
    "StoreUnavailableError",
    "TransactionMisuseError",
    "TransactionalDedupListener",
]
