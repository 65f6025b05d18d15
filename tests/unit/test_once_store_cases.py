"""Deduplicated calls on the in-process stores (memory, a user's store)."""

from tests.shared.call_cases import *  # noqa: F403
