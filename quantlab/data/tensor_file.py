"""``tensors``: the user's own model inputs from one file, ``data.path`` (``.pt`` or ``.npz``).

An item is one model call's inputs: a tensor, or a tuple of tensors for ``model(*item)``, each
with its batch dimension first (usually 1). Items are grouped ``data.batch_size`` at a time
(concatenated along dim 0).

- ``.pt`` / ``.pth`` (``torch.load(weights_only=True)``): a list of items, split in order (the
  first ``num_calib`` calibrate, the next ``num_eval`` evaluate); or a dict with ``calib`` and
  ``eval`` lists. An optional ``labels`` list holds one tensor per evaluation item (with the
  list form: one per item of the list), handed to the task metric.
- ``.npz``: arrays whose dim 0 indexes items (item i is ``array[i:i+1]``): ``calib`` and
  ``eval`` (one input), or ``calib_0``, ``calib_1``, ... and ``eval_0``, ... (several inputs);
  or ``inputs`` / ``inputs_0``, ... (``np.savez(f, x)``'s ``arr_0``, ... too) to be split in
  order; optional ``labels``.

Floating tensors are converted to float32. A file, item or tensor that does not fit (missing
split, empty split, NaN or inf, a shape the model does not take) raises ValueError naming the
file and the item.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from quantlab.data.dataset import Dataset, batches
from quantlab.data.schema import DataConfig
from quantlab.models.inputs import ModelInputs

SUFFIXES = (".pt", ".pth", ".npz")
PT_KEYS = ("calib", "eval", "inputs", "labels")

Item = tuple[Tensor, ...]


def _as_item(value: Any, where: str) -> Item:
    parts = value if isinstance(value, tuple | list) else (value,)
    if not parts or not all(isinstance(t, Tensor) for t in parts):
        kinds = ", ".join(type(t).__name__ for t in parts) or "nothing"
        raise ValueError(f"{where} must be a tensor or a tuple of tensors, got {kinds}")
    out = []
    for t in parts:
        if t.dim() == 0:
            raise ValueError(f"{where} holds a 0-d tensor; each tensor needs a batch dimension")
        out.append(t.to(torch.float32) if t.is_floating_point() else t)
    return tuple(out)


def _items(values: Any, where: str) -> list[Item]:
    if isinstance(values, Tensor) or not isinstance(values, list | tuple):
        raise ValueError(f"{where} must be a list of items, got {type(values).__name__}")
    return [_as_item(v, f"{where}[{i}]") for i, v in enumerate(values)]


def _read_pt(path: Path) -> tuple[list[Item] | None, list[Item] | None, list[Item] | None, Any]:
    """(items to split, calib, eval, labels) of a .pt file."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # unpickling errors come in many types
        raise ValueError(
            f"data.path: {path} cannot be read as a weights-only torch file: {err}"
        ) from None
    src = f"data.path: {path}"
    if isinstance(obj, dict):
        unknown = [k for k in obj if k not in PT_KEYS]
        if unknown:
            raise ValueError(
                f"{src}: unknown key(s) {unknown[:5]}; allowed: {', '.join(PT_KEYS)} (a list "
                "of items under 'inputs', or 'calib' and 'eval' lists)"
            )
        if "inputs" in obj:
            if "calib" in obj or "eval" in obj:
                raise ValueError(f"{src}: give either 'inputs' or 'calib' and 'eval', not both")
            return _items(obj["inputs"], f"{src} inputs"), None, None, obj.get("labels")
        missing = [k for k in ("calib", "eval") if k not in obj]
        if missing:
            raise ValueError(f"{src}: the '{missing[0]}' list is missing (keys: {list(obj)})")
        calib = _items(obj["calib"], f"{src} calib")
        return None, calib, _items(obj["eval"], f"{src} eval"), obj.get("labels")
    return _items(obj, f"{src} items"), None, None, None


def _npz_group(arrays: dict, prefix: str, where: str) -> list[Item] | None:
    keys = [prefix] if prefix in arrays else []
    keys += sorted((k for k in arrays if re.fullmatch(rf"{prefix}_\d+", k)), key=_index)
    if not keys:
        return None
    tensors = [torch.from_numpy(np.ascontiguousarray(arrays[k])) for k in keys]
    n = {t.shape[0] if t.dim() else 0 for t in tensors}
    if len(n) != 1 or 0 in n:
        raise ValueError(f"{where}: arrays {keys} must have the same number (> 0) of items")
    return [
        _as_item([t[i : i + 1] for t in tensors], f"{where} {prefix}[{i}]") for i in range(n.pop())
    ]


def _index(key: str) -> int:
    return int(key.rpartition("_")[2])


def _read_npz(path: Path):
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as err:  # zip / format errors
        raise ValueError(f"data.path: {path} cannot be read as .npz: {err}") from None
    src = f"data.path: {path}"
    if any(k.startswith("arr_") for k in arrays):
        arrays = {("inputs" + k[3:] if k.startswith("arr_") else k): v for k, v in arrays.items()}
    labels = arrays.pop("labels", None)
    allowed = ("calib", "eval", "inputs")
    unknown = [k for k in arrays if re.sub(r"_\d+$", "", k) not in allowed]
    if unknown:
        raise ValueError(
            f"{src}: unknown array(s) {unknown[:5]}; allowed: calib, eval (or calib_0, eval_0, "
            "...), inputs (or inputs_0, ...), labels"
        )
    label_items = (
        None
        if labels is None
        else [torch.from_numpy(labels[i : i + 1]) for i in range(len(labels))]
    )
    inputs = _npz_group(arrays, "inputs", src)
    if inputs is not None:
        return inputs, None, None, label_items
    calib, evals = _npz_group(arrays, "calib", src), _npz_group(arrays, "eval", src)
    if calib is None or evals is None:
        raise ValueError(f"{src}: needs 'inputs', or both 'calib' and 'eval' (has {list(arrays)})")
    return None, calib, evals, label_items


def _check(items: list[Item], split: str, path: Path, model: ModelInputs | None) -> None:
    src = f"data.path: {path}"
    arity = len(items[0])
    for i, item in enumerate(items):
        if len(item) != arity:
            raise ValueError(f"{src}: {split} item {i} has {len(item)} tensors, item 0 has {arity}")
        for j, t in enumerate(item):
            if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                bad = "NaN" if bool(torch.isnan(t).any()) else "inf"
                raise ValueError(
                    f"{src}: {split} item {i}, input {j} holds {bad} values; calibration and "
                    "evaluation inputs must be finite"
                )
        if model is not None and model.shapes is not None:
            got = tuple(tuple(t.shape[1:]) for t in item)
            if len(got) != len(model.shapes) or got != tuple(model.shapes):
                raise ValueError(
                    f"{src}: {split} item {i} has tensors of shape "
                    f"{[list(t.shape) for t in item]}, but model {model.name} takes "
                    f"{[['N', *s] for s in model.shapes]} (N: batch)"
                )


def _collater(path: Path):
    def collate(items: list[Item]) -> Item:
        try:
            return tuple(torch.cat([it[j] for it in items], 0) for j in range(len(items[0])))
        except RuntimeError:
            shapes = sorted({str([list(t.shape) for t in it]) for it in items})
            raise ValueError(
                f"data.path: items of {path} with shapes {', '.join(shapes)} cannot share a "
                "batch; set data.batch_size=1"
            ) from None

    return collate


def load(cfg: DataConfig, model: ModelInputs | None = None) -> Dataset:
    path = Path(cfg.path)
    if path.suffix.lower() not in SUFFIXES:
        raise ValueError(
            f"data.path: {path} must be a {' or '.join(SUFFIXES)} file for data=tensors "
            "(use data=images for a folder of images)"
        )
    if not path.is_file():
        raise ValueError(f"data.path: file {path} does not exist")
    reader = _read_npz if path.suffix.lower() == ".npz" else _read_pt
    pool, calib, evals, labels = reader(path)
    if pool is not None:
        calib = pool[: cfg.num_calib]
        evals = pool[cfg.num_calib : cfg.num_calib + cfg.num_eval]
        if labels is not None:
            labels = list(labels)[cfg.num_calib : cfg.num_calib + cfg.num_eval]
    else:
        calib, evals = calib[: cfg.num_calib], evals[: cfg.num_eval]
        labels = None if labels is None else list(labels)[: cfg.num_eval]
    for split, items in (("calib", calib), ("eval", evals)):
        if not items and pool is not None:
            raise ValueError(
                f"data.path: {path} holds {len(pool)} items, which leaves none to {split} "
                f"(data.num_calib={cfg.num_calib}: the first num_calib items calibrate, the "
                "next num_eval evaluate); lower data.num_calib or add items"
            )
        if not items:
            raise ValueError(f"data.path: the '{split}' list of {path} is empty")
        _check(items, split, path, model)
    label_batches = None
    if labels is not None:
        if len(labels) != len(evals) or not all(isinstance(x, Tensor) for x in labels):
            raise ValueError(
                f"data.path: {path} 'labels' must hold one tensor per evaluation item "
                f"({len(evals)}), got {len(labels)}"
            )
        label_batches = batches(labels, cfg.batch_size, lambda xs: torch.cat(xs, 0))
    bs = cfg.batch_size
    return Dataset(
        name="tensors",
        calib=batches(calib, bs, _collater(path)),
        eval=batches(evals, bs, _collater(path)),
        labels=label_batches,
        description=f"{len(calib)} calibration + {len(evals)} evaluation items from {path}",
        calib_ids=[f"{path.name}:calib{i}" for i in range(len(calib))],
        eval_ids=[f"{path.name}:eval{i}" for i in range(len(evals))],
    )
