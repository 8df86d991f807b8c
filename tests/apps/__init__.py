"""Tiny apps served by ``capsvc serve`` in tests/test_cli.py."""
