"""Launch a Hydra app so that bad input ends in one line on stderr and a non-zero exit.

Hydra reports a bad override (unknown group option, misspelled key) as a multi-line message
before the app runs; a preflight compose catches those first and says them in one line, then
validates every config the command would run (each cell of a sweep) and the folder each one would
write to, before Hydra creates any folder and before any data is read. UserError raised by the app
itself, and a failed write (disk full, no permission), are printed the same way. HYDRA_FULL_ERROR=1,
ALIBI_LM_DEBUG=1 or --debug shows the full traceback instead.
"""

from __future__ import annotations

import errno
import itertools
import math
import os
import sys
from pathlib import Path

from .errors import UserError

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


MAX_COMBOS = 64  # a sweep with more cells is checked one swept value at a time, not every combination
# Write failures that are the environment's, not a bug: reported in one line like a UserError.
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR}


def _debug() -> bool:
    return os.environ.get("HYDRA_FULL_ERROR") == "1" or os.environ.get("ALIBI_LM_DEBUG") == "1"


def fail(message: str, status: int = 2):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(status)


def _explain(e: Exception) -> str:
    from hydra.errors import MissingConfigException

    text = str(e).strip()
    if isinstance(e, MissingConfigException) and "Could not find '" in text:
        missing = text.split("Could not find '")[1].split("'")[0]  # e.g. position/foo
        group, _, option = missing.rpartition("/")
        options = sorted(p.stem for p in Path(CONFIG_DIR, group).glob("*.yaml")) if group else []
        return f"unknown {group or 'config'} {option!r}; choose one of {', '.join(options)}"
    if "Could not override '" in text:
        key = text.split("Could not override '")[1].split("'")[0]
        return f"unknown config key {key!r} (misspelled?); `--cfg job` prints the valid keys, `+{key}=...` adds a new one"
    return text.splitlines()[0]


def _combos(choices: list[list[str]]) -> list[list[str]]:
    """Every combination of the swept values when there are few; else each swept value once, the other
    overrides at their first value."""
    if math.prod(len(c) for c in choices) <= MAX_COMBOS:
        return [list(c) for c in itertools.product(*choices)]
    combos = [[c[0] for c in choices]]
    for i, c in enumerate(choices):
        combos += [[*(x[0] for x in choices[:i]), v, *(x[0] for x in choices[i + 1 :])] for v in c[1:]]
    return combos


def _output_dir(cfg, multirun: bool) -> Path | None:
    """The folder Hydra would create for this config (hydra.run.dir, or sweep.dir/sweep.subdir)."""
    from omegaconf import OmegaConf

    try:
        if multirun:
            return Path(OmegaConf.select(cfg, "hydra.sweep.dir"), OmegaConf.select(cfg, "hydra.sweep.subdir"))
        return Path(OmegaConf.select(cfg, "hydra.run.dir"))
    except Exception:  # noqa: BLE001 - e.g. ${now:...} or ${hydra.job.*}: known only once Hydra runs
        return None


def preflight(config_name: str, argv: list[str], validate=None, validate_run=None) -> None:
    """Compose the config of every job the command line would run and validate it: validate(cfg), and
    validate_run(cfg, output_dir) with the folder Hydra would create for that job. Exits with one line
    on the first problem."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import open_dict

    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    multirun = any(a in ("-m", "--multirun") for a in argv)
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's own parse errors
        if _debug():
            raise
        fail(f"cannot parse overrides: {str(e).splitlines()[0]}")
    choices = []
    for o in parsed:
        if o.is_hydra_override() or o.key_or_group.startswith("hydra"):
            continue
        values = [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.get_value_element_as_str()]
        prefix = "".join(["+" if o.is_add() else "", "~" if o.is_delete() else "", "++" if o.is_force_add() else ""])
        choices.append([f"{prefix}{o.key_or_group}={v}" for v in values] if not o.is_delete() else [f"~{o.key_or_group}"])
    hydra_overrides = [a for a in overrides if a.lstrip("+~").startswith("hydra")]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
            for combo in _combos(choices):
                try:
                    cfg = compose(config_name, overrides=combo, return_hydra_config=True)
                except Exception as e:  # noqa: BLE001 - Hydra composition errors
                    if _debug():
                        raise
                    fail(_explain(e))
                output_dir = _output_dir(cfg, multirun)
                if hydra_overrides:  # they may move the output folder; Hydra reports its own bad ones
                    try:
                        hcfg = compose(config_name, overrides=[*combo, *hydra_overrides], return_hydra_config=True)
                        output_dir = _output_dir(hcfg, multirun)
                    except Exception:  # noqa: BLE001
                        output_dir = None
                with open_dict(cfg):
                    del cfg["hydra"]
                try:
                    if validate is not None:
                        validate(cfg)
                    if validate_run is not None and output_dir is not None:
                        validate_run(cfg, output_dir)
                except UserError as e:
                    if _debug():
                        raise
                    fail(str(e))
    finally:
        GlobalHydra.instance().clear()


def _guard(task):
    """task(cfg) with UserError and a failed write turned into one line on stderr and exit status 2."""

    def guarded(cfg):
        try:
            return task(cfg)
        except UserError as e:
            if _debug():
                raise
            fail(str(e))
        except OSError as e:
            if _debug() or e.errno not in WRITE_ERRNOS:
                raise
            from .errors import write_error

            fail(str(write_error(e.filename or "a file", e)))

    return guarded


def run(config_name: str, task, validate=None, validate_run=None) -> None:
    """Entry point: preflight, then hydra.main(task) with UserError -> one line, exit 2."""
    import hydra

    args = sys.argv[1:]
    if "--debug" in args:  # ours, not Hydra's: full tracebacks
        args.remove("--debug")
        os.environ["ALIBI_LM_DEBUG"] = "1"
        sys.argv = [sys.argv[0], *args]
    if not any(a in ("-h", "--help", "--hydra-help", "--info") or a.startswith("--cfg") for a in args):
        preflight(config_name, args, validate, validate_run)

    hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base="1.3")(_guard(task))()
