"""Fixtures of the simulator tests."""

from __future__ import annotations

import pytest

from quantlab.simulate import steady


@pytest.fixture
def hit_names(monkeypatch):
    """The names of the calls that followed their prepared form, in order."""
    names = []
    real = steady.prepared_value

    def named(sim, prep, call, st):
        got = real(sim, prep, call, st)
        if got is not None:
            names.append(call.name)
        return got

    monkeypatch.setattr(steady, "prepared_value", named)
    return names
