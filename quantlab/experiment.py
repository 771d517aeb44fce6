"""Experiments: a schema dataclass, one function, a registry keyed by the schema's type.

An experiment composes library calls and returns an ``ExperimentResult``: a tidy table (one row
per measurement, one column per parameter and metric) plus what the shared report code needs to
draw plots and write ``report.md``. Experiments never write files or plot by hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from quantlab.report.plots import Plot


@dataclass
class RunContext:
    """What an experiment may use besides its own config."""

    platform: Any  # quantlab.platforms.PlatformConfig
    model: Any  # quantlab.models.schema.ModelConfig
    data: Any  # quantlab.data.schema.DataConfig
    seed: int | None
    output_dir: Path
    sweep_value: dict[str, Any] = field(default_factory=dict)  # overrides of this job
    qconfig: Any = None  # quantlab.qconfig_presets.QConfigChoice (None: the platform template)
    progress: bool = True  # progress bars (tqdm) on stderr for long work
    # the command chose the model (``model=...``, or the user's own: custom / onnx); an
    # experiment with a list of its own (``exp.models``) then runs that model alone
    model_chosen: bool = False


@dataclass
class ExperimentResult:
    """A tidy ``table`` plus the report's findings, extra tables and plots."""

    table: pd.DataFrame
    title: str
    findings: list[str] = field(default_factory=list)  # sentences with numbers, shown first
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)  # extra tables (also CSV)
    plots: list[Plot] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # method notes shown after the tables
    # what the run decided, ready to pass back: file name -> (QConfigSpec, header comment),
    # written as qconfig YAML into <run>/qconfig/ (``qconfig=file qconfig.path=<that file>``)
    qconfigs: dict[str, tuple[Any, str]] = field(default_factory=dict)


ExperimentFn = Callable[[Any, RunContext], ExperimentResult]


@dataclass(frozen=True)
class _Entry:
    name: str
    schema: type
    fn: ExperimentFn
    takes_model: bool  # runs the model ``model=...`` chooses (RunContext.model)


_REGISTRY: dict[type, _Entry] = {}


def experiment(
    schema: type, name: str, *, takes_model: bool = False
) -> Callable[[ExperimentFn], ExperimentFn]:
    """Register ``fn`` as the experiment for configs of type ``schema`` (``+exp=<name>``).
    ``takes_model``: it runs the model the command chooses (``model=...``, your own included);
    an experiment without it refuses a chosen model (``check_model_choice``)."""

    def register(fn: ExperimentFn) -> ExperimentFn:
        _REGISTRY[schema] = _Entry(name, schema, fn, takes_model)
        return fn

    return register


def check_model_choice(entry: _Entry, exp: Any, model_name: str, chosen: bool) -> None:
    """A model chosen on the command line (``model=...``; your own, custom or onnx, counts as
    chosen) must be one the experiment runs: ValueError otherwise, naming the experiments that
    take one and, where the experiment has a list of its own, the field that sets it."""
    if not chosen or entry.takes_model:
        return
    takers = ", ".join(sorted(e.name for e in registered().values() if e.takes_model))
    own = getattr(exp, "models", None)
    where = (
        f"it runs the models of exp.models (now {[getattr(m, 'name', m) for m in own]}); set "
        "that list instead"
        if own is not None
        else "it builds the models it studies itself"
    )
    raise ValueError(
        f"model={model_name}: +exp={entry.name} does not take a model ({where}). The "
        f"experiments that run the model you choose: {takers}"
    )


def lookup(schema_type: type) -> _Entry:
    """The experiment registered for a config type; LookupError lists the known ones."""
    load_all()
    try:
        return _REGISTRY[schema_type]
    except KeyError:
        known = ", ".join(sorted(e.name for e in _REGISTRY.values()))
        raise LookupError(
            f"no experiment is registered for config type {schema_type.__name__}; "
            f"known experiments: {known}"
        ) from None


def registered() -> dict[str, _Entry]:
    load_all()
    return {e.name: e for e in _REGISTRY.values()}


def load_all() -> None:
    """Import every module of the ``experiments`` package so that each registers itself."""
    import importlib
    import pkgutil

    import experiments

    for info in pkgutil.iter_modules(experiments.__path__):
        if not info.name.startswith("_"):
            importlib.import_module(f"experiments.{info.name}")
