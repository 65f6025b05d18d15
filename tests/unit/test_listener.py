"""The listener's cases, on the memory store and a user store adapter (no server)."""

from tests.shared.listener_cases import *  # noqa: F403
