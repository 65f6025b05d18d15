"""Tests against the real Redis, Redis Cluster, Sentinel and MariaDB (scripts/services.sh)."""
