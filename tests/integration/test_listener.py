"""The listener's cases, on Redis, Redis Cluster and MariaDB (three drivers)."""

from tests.shared.listener_cases import *  # noqa: F403
