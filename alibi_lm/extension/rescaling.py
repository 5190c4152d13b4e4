"""RoPE's frequency rescalings as members of the extension group: linear (position interpolation), ntk, dynamic,
yarn and llama3, with their formulas in positions/rope.py. They change the scheme's frequencies, not which keys a
query sees or the distances it is given, so they go through the rope scheme's set_scaling (which refuses every
other scheme in one line). Their rows carry the labels the older position.scaling key gave them (yarn, yarn-x4)."""

from __future__ import annotations

from dataclasses import dataclass

from ..positions.rope import ROPE_SCALINGS, check_scaling, scaling_factor, scaling_label

RESCALINGS = ROPE_SCALINGS
FACTOR_KEY = "extension.factor"  # extension=yarn extension.factor=4: the key its messages name


@dataclass
class RescalingOptions:
    factor: float | None = None  # the scale factor s; null: Lv / L at each length (1 for dynamic)

    def __post_init__(self):
        check_scaling("linear", self.factor, factor_key=FACTOR_KEY)


# one options class per method (an empty subclass each), so that a composed config's type names its method
RESCALING_OPTIONS: dict[str, type[RescalingOptions]] = {
    name: dataclass(type(f"{name.capitalize()}Options", (RescalingOptions,), {})) for name in RESCALINGS
}


class Rescaling:
    """One of RESCALINGS with its factor, for a model trained at train_len."""

    Options = RescalingOptions
    hides_keys = False

    def __init__(self, name: str, options: RescalingOptions | None, train_len: int | None):
        check_scaling(name, None if options is None else options.factor, factor_key=FACTOR_KEY)
        self.name, self.options, self.train_len = name, options or RescalingOptions(), train_len

    def set_on(self, scorer, eval_len: int) -> None:
        """Set the frequencies for evaluation length eval_len on a scorer (or scheme) with set_scaling."""
        factor = 1.0 if self.train_len is None else scaling_factor(self.name, self.options.factor, self.train_len, eval_len)
        scorer.set_scaling(self.name, factor, self.train_len)

    def label(self) -> str:
        return scaling_label(self.name, self.options.factor)
