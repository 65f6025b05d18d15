"""The values of the rows :mod:`.sql` defines: a record's key and readable columns, an entity's
key, a key's named lock. Shared by the store and its transactions."""

from __future__ import annotations

import base64
from typing import Any, List

from rocketmq_dedup.message import DedupElement


def readable(text: str) -> str:
    """The first 255 characters, for the readable columns (``VARCHAR(255)``)."""
    if text.isascii():
        return text[:255]
    return text[:255].encode("utf-8", "replace").decode("utf-8")


def record_row(element: DedupElement, digest: bytes) -> List[Any]:
    """The key and readable columns of ``element``'s row (``digest``: its
    :func:`~rocketmq_dedup.message.element_digest`)."""
    app, topic, tag, key = element
    return [digest, readable(app), readable(topic), readable(tag), readable(key)]


def lock_name(digest: bytes) -> str:
    """The named lock (``GET_LOCK``) of a record key: 58 characters (the server takes 64)."""
    return "rocketmq_dedup:" + base64.urlsafe_b64encode(digest).decode("ascii").rstrip("=")


__all__ = ["lock_name", "readable", "record_row"]
