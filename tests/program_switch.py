"""Steady runs that build their traced program in their first run, for tests of programs."""

from __future__ import annotations


def build_in_first_run(monkeypatch) -> None:
    """``Simulator.run``'s steady runs build their program in their first run: the seconds and
    runs a signature rents before it builds (``steady_programs.PROGRAM_AFTER_S`` and
    ``PROGRAM_AFTER_RUNS``) set to none, for this test."""
    from quantlab.simulate import steady_programs

    monkeypatch.setattr(steady_programs, "PROGRAM_AFTER_S", 0.0)
    monkeypatch.setattr(steady_programs, "PROGRAM_AFTER_RUNS", 1)
