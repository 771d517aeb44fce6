"""Hydra structured configs: the root schema and one schema per group, in Hydra's ConfigStore.

Groups mirror code: ``platform/`` -> quantlab.platforms.PlatformConfig, ``model/`` ->
quantlab.models.schema.ModelConfig, ``data/`` -> quantlab.data.schema.DataConfig, ``qconfig/``
-> quantlab.qconfig_presets.QConfigChoice, ``exp/`` ->
one dataclass per experiment (registered by the experiment module). YAML files extend a schema
with ``defaults: [schema]`` and set values only; Hydra then rejects unknown keys and enum names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, OmegaConf

from quantlab.data.schema import DataConfig
from quantlab.models.schema import ModelConfig
from quantlab.platforms import PlatformConfig
from quantlab.qconfig_presets import QConfigChoice

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


@dataclass
class Config:
    """Root config. ``exp`` is chosen with ``+exp=<name>`` on the command line."""

    platform: PlatformConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    qconfig: QConfigChoice = MISSING
    exp: Any = None
    seed: int | None = 0
    progress: bool = True  # progress lines on stderr for long work
    # the process keeps freed memory for reuse (glibc malloc; quantlab.host_memory): large
    # activations then skip the kernel's page faults; false: the C library's default
    keep_freed_memory: bool = True
    publish_dir: str | None = None  # also copy the run's report here (e.g. reports/<exp>)
    extra: dict[str, Any] = field(default_factory=dict)


def register_schema(group: str, name: str, node: type) -> None:
    ConfigStore.instance().store(group=group, name=name, node=node)


def register_base_schemas() -> None:
    cs = ConfigStore.instance()
    cs.store(name="config_schema", node=Config)
    cs.store(group="platform", name="schema", node=PlatformConfig)
    cs.store(group="model", name="schema", node=ModelConfig)
    cs.store(group="data", name="schema", node=DataConfig)
    cs.store(group="qconfig", name="schema", node=QConfigChoice)


def register_all() -> None:
    """Store every schema (base groups and all experiments) in Hydra's ConfigStore."""
    register_base_schemas()
    from quantlab.experiment import load_all

    load_all()


def compose(overrides: list[str] | None = None) -> Config:
    """Compose ``configs/config.yaml`` with overrides (no run folder) into a Config object."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register_all()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides or []))
    return to_config(cfg)


def compose_group(group: str, option: str) -> Any:
    """Compose one option of one group, e.g. ``compose_group("platform", "j6m")``."""
    return getattr(compose([f"{group}={option}"]), group)


def to_config(cfg: Any) -> Config:
    """Convert a composed DictConfig to real dataclass instances (``__post_init__`` runs)."""
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]
