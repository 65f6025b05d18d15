"""The decision rules, on Redis, Redis Cluster and MariaDB (three drivers)."""

from tests.shared.decision_cases import *  # noqa: F403
