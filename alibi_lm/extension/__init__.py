"""Training-free ways to run a model past its training length L, chosen by the evaluate app's extension group.

Every method is a key mask plus a distance remap (base.py), one small module each:

    streaming      StreamingLLM (Xiao et al., ICLR 2024): attention sinks plus a window, at cache-slot distances
    lm_infinite    LM-Infinite (Han et al., NAACL 2024): a Lambda-shaped mask, every distance capped at L
    self_extend    Self-Extend (Jin et al., ICML 2024): grouped distances past a neighbour window
    rerope         ReRoPE and Leaky ReRoPE (Su, 2023): distances capped, or compressed, past a window
    dca            Dual Chunk Attention (An et al., ICML 2024): intra-, successive- and inter-chunk distances
    rescaling      RoPE's frequency rescalings (linear/PI, ntk, dynamic, yarn, llama3), which change the scheme's
                   frequencies, not the distances (positions/rope.py holds their formulas)

build_extension(name, options, train_len) makes one; the model applies a mask-and-remap method in every layer
(TransformerLM.extension), a rescaling through the scheme's set_scaling.
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import ExtensionMethod, ExtensionOptions, Remap, check_scheme, scheme_kind
from .dca import DualChunk
from .lm_infinite import LMInfinite
from .rerope import LeakyReRoPE, ReRoPE
from .rescaling import RESCALING_OPTIONS, RESCALINGS, Rescaling
from .rotary import remapped_scores
from .self_extend import SelfExtend
from .streaming import Streaming

REMAP_METHODS: dict[str, type[ExtensionMethod]] = {
    cls.name: cls for cls in (Streaming, LMInfinite, SelfExtend, ReRoPE, LeakyReRoPE, DualChunk)
}
METHODS = (*REMAP_METHODS, *RESCALINGS)
# each method's options dataclass, the schema of configs/extension/<name>.yaml: distinct types, so that a composed
# config's extension node names its method (method_of)
OPTIONS = {**{name: cls.Options for name, cls in REMAP_METHODS.items()}, **RESCALING_OPTIONS}


def options_of(name: str) -> type:
    """The options dataclass of method `name`."""
    if name not in OPTIONS:
        raise ConfigError(f"extension must be one of {', '.join(METHODS)}, got {name!r}")
    return OPTIONS[name]


def method_of(options) -> str:
    """The method whose options `options` (an instance or its type) are."""
    kind = options if isinstance(options, type) else type(options)
    return next(name for name, cls in OPTIONS.items() if cls is kind)


def build_extension(name: str, options, train_len: int) -> ExtensionMethod | Rescaling:
    """Method `name` with its options (an ExtensionOptions or a dict of extension.* keys) for a model trained at
    train_len; a one-line ConfigError for an unknown name or a bad value."""
    kind = options_of(name)
    if isinstance(options, dict):
        unknown = set(options) - {f for f in kind.__dataclass_fields__}
        if unknown:
            raise ConfigError(f"extension={name} has no key {sorted(unknown)[0]!r}; its keys: "
                              f"{', '.join(kind.__dataclass_fields__)}")
        options = kind(**options)
    if name in RESCALINGS:
        return Rescaling(name, options, train_len)
    return REMAP_METHODS[name](options, train_len)


__all__ = ["METHODS", "OPTIONS", "REMAP_METHODS", "RESCALINGS", "ExtensionMethod", "ExtensionOptions", "Remap", "Rescaling",
           "build_extension", "check_scheme", "method_of", "options_of", "remapped_scores", "scheme_kind"]
