"""Test bodies shared by the unit and the integration layers. Each module here is imported by
one module per layer (``from tests.shared.decision_cases import *``), which runs its tests on
that layer's ``store`` fixture: tests/unit on the in-process stores, tests/integration on the
servers. So every test here takes ``store`` (or a server fixture); a test that needs no store
lives in tests/unit, where it runs once (tests/unit/test_layout.py checks this)."""
