"""Deduplicated calls on Redis, Redis Cluster, MariaDB (three drivers) and PostgreSQL."""

from tests.shared.call_cases import *  # noqa: F403
