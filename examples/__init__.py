"""Runnable examples (see the README)."""
