"""Consumer-side message deduplication for RocketMQ Python consumers.

A port of the Java RocketMQDedupListener: subclass :class:`DedupConcurrentListener`, implement
``do_handle_msg``, give it a :class:`DedupConfig` with a Redis, MySQL or PostgreSQL store, and
subscribe it.
For handlers that write to MySQL/MariaDB, :class:`TransactionalDedupListener` commits their
writes and the dedup record in one transaction (exactly once).
"""

from rocketmq_dedup.config import DedupConfig
from rocketmq_dedup.errors import (
    ClientConflictError,
    DedupConfigError,
    DedupError,
    MissingExtraError,
    PermanentFailure,
    StoreError,
    StoreLockConflictError,
    StoreMisconfiguredError,
    StorePoolExhaustedError,
    StoreUnavailableError,
    TransactionMisuseError,
)
from rocketmq_dedup.listener import BaseDedupListener, DedupConcurrentListener
from rocketmq_dedup.message import DedupElement
from rocketmq_dedup.purger import Purger
from rocketmq_dedup.status import (
    ConsumeStatus,
    DedupStatus,
    ExactlyOnceClaim,
    Outcome,
    PayloadMismatch,
    PermanentFailurePolicy,
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
    "ClientConflictError",
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
    "PermanentFailure",
    "PermanentFailurePolicy",
    "PostgresDedupStore",
    "Purger",
    "Record",
    "RedisDedupStore",
    "SequenceMode",
    "StoreError",
    "StoreFailurePolicy",
    "StoreLockConflictError",
    "StoreMisconfiguredError",
    "StorePoolExhaustedError",
    "StoreUnavailableError",
    "TransactionMisuseError",
    "TransactionalDedupListener",
]
