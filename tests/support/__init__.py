"""Helpers the tests (and the benchmark) share, imported one way: ``from tests.support.x import ...``."""
