"""``python tests/sweep/run_quantlab.py ...``: ``python -m quantlab ...`` with the sweep probe."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sweep_probe  # noqa: E402, F401  (registers the sweep_probe experiment)

from quantlab.__main__ import main  # noqa: E402

if __name__ == "__main__":
    # Hydra resolves the config path against the calling module; from a script, name it.
    config_dir = Path(__file__).resolve().parents[2] / "configs"
    sys.argv[1:1] = ["--config-path", str(config_dir)]
    main()
