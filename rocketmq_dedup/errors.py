"""The exception hierarchy: everything the library raises derives from :class:`DedupError`."""

from __future__ import annotations


class DedupError(Exception):
    """Base class of every error raised by rocketmq-dedup."""


class DedupConfigError(DedupError, ValueError):
    """A configuration is invalid; raised at construction, never at the first message."""


class StoreError(DedupError):
    """The dedup record store failed (connection lost, timeout, SQL or Redis error).

    The driver's exception is chained as ``__cause__``.
    """


class MissingExtraError(DedupError, ImportError):
    """An optional dependency is not installed; the message names the extra to install."""

    def __init__(self, module: str, extra: str) -> None:
        super().__init__(f"{module!r} is not installed: pip install 'rocketmq-dedup[{extra}]'")
        self.module = module
        self.extra = extra
