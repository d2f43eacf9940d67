"""Shared fixtures: a clean process-wide registry around tests that register plugins."""

from __future__ import annotations

import pytest

import transformer_kit as tk


@pytest.fixture
def fresh_registry(monkeypatch):
    """The process-wide registry rebuilt before and after the test."""
    monkeypatch.delenv(tk.registry.BLOCK_ENV, raising=False)
    monkeypatch.delenv(tk.registry.DISABLE_AUTOLOAD_ENV, raising=False)
    registry = tk.reset_registry()
    yield registry
    monkeypatch.undo()
    tk.reset_registry()
