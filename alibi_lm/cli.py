"""Launch a Hydra app so that bad input ends in one line on stderr and a non-zero exit.

Hydra reports a bad override (unknown group option, misspelled key) as a multi-line message
before the app runs; a preflight compose catches those first and says them in one line.
UserError raised by the app itself is printed the same way. HYDRA_FULL_ERROR=1 or
ALIBI_LM_DEBUG=1 shows the full traceback instead.
"""

from __future__ import annotations

import itertools
import os
import sys
from pathlib import Path

from .errors import UserError

CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "configs")


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


def preflight(config_name: str, argv: list[str], validate=None) -> None:
    """Compose the config for each value of every swept override and validate it."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = [a for a in argv if "=" in a and not a.startswith("-")]
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # noqa: BLE001 - Hydra's own parse errors
        fail(f"cannot parse overrides: {str(e).splitlines()[0]}")
    choices = []
    for o in parsed:
        if o.is_hydra_override() or o.key_or_group.startswith("hydra"):
            continue
        values = [str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override() else [o.get_value_element_as_str()]
        prefix = "".join(["+" if o.is_add() else "", "~" if o.is_delete() else "", "++" if o.is_force_add() else ""])
        choices.append([f"{prefix}{o.key_or_group}={v}" for v in values] if not o.is_delete() else [f"~{o.key_or_group}"])
    # each swept value once, the other overrides at their first value
    combos = [[c[0] for c in choices]]
    for i, c in enumerate(choices):
        combos += [[*(x[0] for x in choices[:i]), v, *(x[0] for x in choices[i + 1 :])] for v in c[1:]]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        for combo in itertools.islice(combos, 200):
            try:
                cfg = compose(config_name, overrides=combo)
            except Exception as e:  # noqa: BLE001 - Hydra composition errors
                if _debug():
                    raise
                fail(_explain(e))
            if validate is not None:
                try:
                    validate(cfg)
                except UserError as e:
                    fail(str(e))
    GlobalHydra.instance().clear()


def run(config_name: str, task, validate=None) -> None:
    """Entry point: preflight, then hydra.main(task) with UserError -> one line, exit 2."""
    import hydra

    args = sys.argv[1:]
    if not any(a in ("-h", "--help", "--hydra-help", "--info") or a.startswith("--cfg") for a in args):
        preflight(config_name, args, validate)

    def guarded(cfg):
        try:
            return task(cfg)
        except UserError as e:
            if _debug():
                raise
            fail(str(e))

    hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base="1.3")(guarded)()
