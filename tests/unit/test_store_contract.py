"""The store contract, on the memory store and a user store adapter (no server)."""

from tests.shared.store_contract import *  # noqa: F403
