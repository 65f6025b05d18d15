"""The store contract, on Redis, Redis Cluster and MariaDB (three drivers)."""

from tests.shared.store_contract import *  # noqa: F403
