"""The qconfig YAML file: the serialisation of one ``QConfigSpec`` (``quantlab.qconfig``).

``save(spec, path)`` writes it, ``load(path)`` reads it back into an equal ``QConfigSpec``. The
file sets precision at the vendor's four levels, each an ``OpQConfig`` entry; per field the most
specific rule wins (op name > module glob > op type > platform template > global):

```yaml
use_platform_template: true        # start from the platform's recipe (qconfig template)
global:                            # QConfigSpec.global_: every op
  output_dtype: INT8
by_type:                           # op types as quantlab names them (conv2d, matmul, sigmoid ...)
  matmul: {input_dtype: INT8}
by_module:                         # fnmatch glob on the module path (the vendor's subgraph)
  "backbone.stage3.*": {output_dtype: INT16, observer: PERCENTILE, percentile: 99.9}
by_name:                           # one op call: module path, op type, call index
  "head.cls:conv2d#0": {weight_dtype: INT16, weight_split: 0}
  "decoder:inverse_sigmoid#0": {lut_strategy: EVENLY, fixed_scale: 0.0625, observer: FIXED}
```

Entry fields are those of ``OpQConfig``: ``input_dtype``, ``output_dtype``, ``weight_dtype``
(``DType`` names), ``observer`` (an ``ObserverKind`` name), ``fixed_scale``, ``percentile``,
``lut_strategy`` (a ``quantlab.numerics.lut.Strategy`` name), ``high_precision_output``,
``weight_split`` (the high/low int8 weight split, 0 = off), ``activation_symmetry``
(``SYMMETRIC`` or ``ASYMMETRIC``: int8 activations with a zero point from min / max) and
``single_period`` (sin/cos: the plugin's single-period op). A field left out inherits. Floats
are written with Python's shortest round-tripping repr, so a saved spec loads back exactly.
"""

from __future__ import annotations

import enum
import os
from dataclasses import fields
from pathlib import Path
from typing import Any

from quantlab.qconfig import OpQConfig, QConfigSpec

LEVELS = ("global", "by_type", "by_module", "by_name")
TOP_KEYS = ("use_platform_template", *LEVELS)
ENTRY_FIELDS = tuple(f.name for f in fields(OpQConfig))
_HEADER = (
    "quantlab qconfig (quantlab.qconfig.save / load): qconfig=file qconfig.path=<this file>\n"
    "per field the most specific rule wins: by_name > by_module (glob) > by_type > platform "
    "template > global\n"
)


def entry_to_dict(rule: OpQConfig) -> dict[str, Any]:
    """The fields ``rule`` sets (None left out); enum members by name."""
    out: dict[str, Any] = {}
    for name in ENTRY_FIELDS:
        v = getattr(rule, name)
        if v is None:
            continue
        out[name] = v.name if isinstance(v, enum.Enum) else v
    return out


def spec_to_dict(spec: QConfigSpec) -> dict[str, Any]:
    """``spec`` as plain YAML-ready data (levels with no rule are left out)."""
    out: dict[str, Any] = {"use_platform_template": bool(spec.use_platform_template)}
    if spec.global_ is not None:
        out["global"] = entry_to_dict(spec.global_)
    for level in ("by_type", "by_module", "by_name"):
        rules = getattr(spec, level)
        if rules:
            out[level] = {str(k): entry_to_dict(v) for k, v in rules.items()}
    return out


_SCALAR_FIELDS = {
    "fixed_scale": "a number > 0",
    "percentile": "a number in (0, 100]",
    "weight_split": "an integer 0..8",
    "high_precision_output": "true or false",
    "single_period": "true or false",
}


def _entry(data: Any, where: str) -> OpQConfig:
    if data is None:
        return OpQConfig()
    if not isinstance(data, dict):
        raise ValueError(f"{where} must be a mapping of fields, got {type(data).__name__}")
    unknown = [k for k in data if k not in ENTRY_FIELDS]
    if unknown:
        raise ValueError(
            f"{where}: unknown field(s) {', '.join(map(str, unknown))}; "
            f"allowed: {', '.join(ENTRY_FIELDS)}"
        )
    for name, words in _SCALAR_FIELDS.items():
        v = data.get(name)
        if v is None:
            continue
        if name in ("high_precision_output", "single_period"):
            ok = isinstance(v, bool)
        elif name == "weight_split":
            ok = isinstance(v, int) and not isinstance(v, bool)
        else:
            ok = isinstance(v, int | float) and not isinstance(v, bool)
        if not ok:
            raise ValueError(f"{where}.{name} must be {words}, got {v!r}")
    try:
        return OpQConfig(**data)
    except (ValueError, TypeError, KeyError) as err:
        raise ValueError(f"{where}: {err}") from None


def spec_from_dict(data: Any, source: str = "qconfig") -> QConfigSpec:
    """The ``QConfigSpec`` that ``data`` (as ``spec_to_dict`` writes it) describes.

    Errors name ``source`` (e.g. the file), the place in it and the allowed keys or values.
    """
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{source}: the top level must be a mapping, got {type(data).__name__}")
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise ValueError(
            f"{source}: unknown key(s) {', '.join(map(str, unknown))}; "
            f"allowed: {', '.join(TOP_KEYS)}"
        )
    use_template = data.get("use_platform_template", True)
    if not isinstance(use_template, bool):
        raise ValueError(
            f"{source}: use_platform_template must be true or false, got {use_template!r}"
        )
    levels: dict[str, dict[str, OpQConfig]] = {}
    for level in ("by_type", "by_module", "by_name"):
        rules = data.get(level) or {}
        if not isinstance(rules, dict):
            raise ValueError(
                f"{source}: {level} must map names to entries, got {type(rules).__name__}"
            )
        levels[level] = {str(k): _entry(v, f"{source}: {level}[{k!r}]") for k, v in rules.items()}
    glob = data.get("global")
    return QConfigSpec(
        global_=None if glob is None else _entry(glob, f"{source}: global"),
        use_platform_template=use_template,
        **levels,
    )


def save(spec: QConfigSpec, path: str | os.PathLike, header: str = "") -> Path:
    """Write ``spec`` to ``path`` as qconfig YAML (atomically); ``header`` lines become comments."""
    import yaml

    from quantlab.report.io import atomic_write_text

    comment = "".join(f"# {line}\n" for line in (header + "\n" + _HEADER).strip().splitlines())
    body = yaml.safe_dump(spec_to_dict(spec), sort_keys=False, default_flow_style=False)
    return atomic_write_text(path, comment + body)


def load(path: str | os.PathLike) -> QConfigSpec:
    """Read a qconfig YAML file into a ``QConfigSpec``; errors name the file and the entry."""
    import yaml

    path = Path(path)
    if not path.is_file():
        what = "is a folder, not a file" if path.is_dir() else "does not exist"
        raise ValueError(f"qconfig file {path} {what}; qconfig.path must name a YAML file")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ValueError(f"qconfig file {path} is not valid YAML: {err}") from None
    return spec_from_dict(data, f"qconfig file {path}")
