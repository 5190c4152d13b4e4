"""Name -> scheme class. Each scheme module registers itself; the model never tests names.

Each scheme's Options dataclass is the schema that configs/position/<name>.yaml extends; alibi_lm.config
stores it in Hydra's ConfigStore (schema/position/<name>) where configs are composed, so that the model
and the schemes import without Hydra."""

from __future__ import annotations

from functools import partial

from ..registry import name_of, registrar

POSITION_SCHEMES: dict[str, type] = {}  # in registration order: the order of tables and plots
register = registrar(POSITION_SCHEMES, "position scheme")
scheme_of = partial(name_of, POSITION_SCHEMES)  # the registered name of the scheme whose Options `options` is
