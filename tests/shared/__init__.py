"""Test bodies run in both layers: memory and user stores (unit), servers (integration)."""
