"""Tests that need no server: the memory store, fakes, configuration, packaging."""
