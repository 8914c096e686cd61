"""The test suite, in tiers by what a test runs (tests/README.md); shared helpers in ``tests.support``."""
