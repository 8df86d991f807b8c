"""Shared test servers and peer-process helpers (used by tests/interop and others)."""
