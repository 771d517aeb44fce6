"""Platform profiles by name, composed once per process (no experiment imports)."""

from __future__ import annotations

import copy
import functools

from quantlab.platforms import PlatformConfig, load_platform


@functools.lru_cache(maxsize=16)
def _platform_cached(name: str) -> PlatformConfig:
    """Merge ``configs/platform/<name>.yaml`` into the PlatformConfig schema (the group's
    ``defaults: [schema]`` composition, without importing every experiment); falls back to
    ``load_platform`` for files that use more of Hydra's defaults list."""
    from omegaconf import OmegaConf

    from quantlab.config import CONFIG_DIR
    from quantlab.platforms import PLATFORM_NAMES

    path = CONFIG_DIR / "platform" / f"{name}.yaml"
    if not path.exists():
        raise ValueError(f"unknown platform {name!r}; allowed: {', '.join(PLATFORM_NAMES)}")
    raw = OmegaConf.load(path)
    if list(raw.get("defaults", ["schema"])) != ["schema"]:
        return load_platform(name)
    raw.pop("defaults", None)
    merged = OmegaConf.merge(OmegaConf.structured(PlatformConfig), raw)
    return OmegaConf.to_object(merged)


def platform_config(name: str) -> PlatformConfig:
    """``configs/platform/<name>.yaml`` composed once per process (a private copy each time)."""
    return copy.deepcopy(_platform_cached(name))
