"""The decision rules, on the memory store and a user store adapter (no server)."""

from tests.shared.decision_cases import *  # noqa: F403
