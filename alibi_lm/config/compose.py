"""How a command line becomes a typed job: Hydra composes configs/ (the schemas in its ConfigStore, the resolvers
the YAML files use), and OmegaConf.to_object makes the result typed, which runs every section's checks."""

from __future__ import annotations

import dataclasses
import difflib
from importlib import resources
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf, open_dict

from ..errors import ConfigError
from ..extension import OPTIONS as EXTENSION_OPTIONS
from ..model import LMConfig, position_label
from ..positions import POSITION_SCHEMES
from ..positions.registry import scheme_of
from ..tasks import TASKS
from ..tasks.registry import task_of
from .schemas import EvalJob, TrainJob


def _config_dir() -> Path:
    """configs/: alibi_lm/configs where the package is installed from a wheel (setup.py installs the repository's
    configs/ there as package data); in an editable install or a checkout on the path, the repository's own."""
    packaged = resources.files("alibi_lm") / "configs"
    return Path(str(packaged)) if packaged.is_dir() else Path(__file__).resolve().parents[2] / "configs"


CONFIG_DIR = str(_config_dir())


def _scheme_of(options: DictConfig) -> str:
    return scheme_of(OmegaConf.get_type(options))


def run_folder(task: str, position: str, positions: str, seq_len, seed) -> str:
    """A run's folder under runs/<name>/: <position>-L<L>-seed<seed> for language modelling, with the task (and
    -random for randomized positions) in front for a synthetic task. position: model.position_label's (rope+nope4)."""
    scheme = position + ("-random" if positions == "random" else "")
    return f"{scheme}-L{seq_len}-seed{seed}" if task == "lm" else f"{task}-{scheme}-L{seq_len}-seed{seed}"


# ${scheme_of:${position}} in configs/train.yaml: the scheme whose Options the position node is; likewise the task.
OmegaConf.register_new_resolver("scheme_of", _scheme_of, replace=True)
OmegaConf.register_new_resolver("task_of", lambda options: task_of(OmegaConf.get_type(options)), replace=True)
OmegaConf.register_new_resolver("run_folder", run_folder, replace=True)
# ${position_label:${model}}: the run folder's and rows' name of the model's positions (rope+nope4-w64)
OmegaConf.register_new_resolver("position_label", position_label, replace=True)
# ${times:${train.seq_len},0.25}: a setting that follows L (FIRE's threshold)
OmegaConf.register_new_resolver("times", lambda x, factor: float(x) * float(factor), replace=True)


# An app's config by an older name, still accepted wherever a config is named (compose("evaluate"), `python -m
# alibi_lm.eval --config-name evaluate`): configs/ holds each app's config once, under the app's module name.
CONFIG_ALIASES = {"evaluate": "eval"}


def config_name(name: str) -> str:
    """The configs/<name>.yaml that a config name (an app's, or an alias of CONFIG_ALIASES) stands for."""
    return CONFIG_ALIASES.get(name, name)


def compose(app: str, overrides: list[str] = (), config_dir: str = CONFIG_DIR) -> DictConfig:
    """The config `python -m alibi_lm.<app> *overrides` would run (app: train, eval, probes, or an alias such as
    evaluate), with its hydra node (for the output folder); Hydra's errors are raised as they are. For tests, the
    preflight and scripts."""
    register_schemas()
    GlobalHydra.instance().clear()
    with hydra.initialize_config_dir(config_dir=config_dir, version_base="1.3"):
        return hydra.compose(config_name(app), overrides=list(overrides), return_hydra_config=True)


def to_job(cfg: DictConfig):
    """The typed, validated job (TrainJob, EvalJob) of a composed config, without its hydra node."""
    check_typed_keys(cfg)
    if "hydra" in cfg:
        cfg = cfg.copy()
        with open_dict(cfg):
            del cfg["hydra"]
    return OmegaConf.to_object(cfg)


def check_typed_keys(node: DictConfig, path: str = "") -> None:
    """A key added with `+` under a typed section (+eval.max_tokns=2048, +passkey.trial=4) that its dataclass lacks:
    to_object drops it without a word and the run goes on with the default; refused in one line instead."""
    kind = OmegaConf.get_type(node)
    fields = [f.name for f in dataclasses.fields(kind)] if dataclasses.is_dataclass(kind) else None
    for key in node.keys():
        name = f"{path}{key}"
        if name == "hydra":
            continue
        if fields is not None and key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean {path}{close[0]}? " if close else ""
            raise ConfigError(f"unknown config key {name!r}: {kind.__name__} has no such setting, so it would be "
                              f"ignored; {hint}`--cfg job` prints the valid keys")
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_missing() and not child._is_none():
            check_typed_keys(child, f"{name}.")


def model_config(cfg: DictConfig, vocab_size: int) -> LMConfig:
    """The model of a composed train config, for a vocabulary of vocab_size."""
    return dataclasses.replace(to_job(cfg).model, vocab_size=vocab_size)


def typed(cls, cfg, section: str):
    """cls (a config dataclass) from an instance, a dict or a DictConfig (a run's config.yaml, a test's)."""
    if isinstance(cfg, cls):
        return cfg
    values = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    try:
        return cls(**values)
    except TypeError as e:  # a key missing or unknown
        raise ConfigError(f"bad {section} config {values}: {e}") from None


def register_schemas() -> None:
    """Store the schemas the YAML files extend in Hydra's ConfigStore: the two jobs, and every registered
    scheme's Options as schema/position/<name>. Here, where configs are built, not in the model's modules (which
    import without Hydra); compose() and the apps (cli.main) call it again for schemes registered later."""
    schemas = {(None, "train_schema"): TrainJob, (None, "eval_schema"): EvalJob}  # configs/train.yaml, eval.yaml extend them
    schemas.update({("schema/position", name): scheme.Options for name, scheme in POSITION_SCHEMES.items()})
    schemas.update({("schema/task", name): task.Options for name, task in TASKS.items()})
    schemas.update({("schema/extension", name): options for name, options in EXTENSION_OPTIONS.items()})
    store = ConfigStore.instance()
    for (group, name), node in schemas.items():
        # storing converts the dataclass to a config (a quarter of a compose's time): only what is new or changed,
        # a scheme registered since, or one registered again under its name with other Options
        if _STORED.get((group, name)) is not node:
            store.store(group=group, name=name, node=node)
            _STORED[(group, name)] = node


_STORED: dict[tuple[str | None, str], type] = {}  # what register_schemas put in Hydra's ConfigStore


register_schemas()
