"""Attention over explicit positions: what the model's layers share in one forward, and the kernels.

    flex_kernel  FlexAttention's compiled function, its causal block mask, a learnable bias read from one tensor
                 per forward, block sizes that fit the device, the narrowest heads it runs right on each device
                 (bottom: no other module of this package)
    context      AttentionContext (one per forward and scheme: layers may use different ones): the query and key
                 positions, the query blocks, and the scheme's score bias folded with the causal mask (and a window's
                 hidden keys, an extension's remap); MaskCache keeps a static relative bias's fold across forwards
    kernels      attend(): one layer's attention through SDPA (query block by query block), FlexAttention (CUDA), or
                 the explicit path (the diagnostic that returns the probabilities, and a content-aware scheme without a
                 flex score_mod, query block by query block)
    backend      explain_backend(): which of them a forward runs and why; FlexAttention's gradients are probed against
                 the explicit path before training uses it (flex_gradient_loss)

Positions are never derived from tensor shapes. The names below are the package's interface; a test that replaces
one of the modules' state patches the module that holds it (flex_kernel.FLEX_FAILED, context.BLOCK_VALUES, ...).
"""

from .backend import (
    ATTENTION,
    BIAS_TENSOR_WHY,
    choose_backend,
    explain_backend,
    flex_gradient_loss,
    narrow_head_error,
    probe_flex_gradients,
)
from .context import AttentionContext, AttentionWindow, MaskCache, TemperatureTuning
from .flex_kernel import (
    FLEX_BLOCKS,
    FLEX_CPU_MIN_HEAD_DIM,
    FLEX_MIN_HEAD_DIM,
    causal_block_mask,
    flex_attention_fn,
    flex_available,
    flex_block_bytes,
    flex_block_ladder,
    flex_min_head_dim,
    learnable_score_bias,
)
from .kernels import attend, attend_explicitly

__all__ = [
    "ATTENTION", "BIAS_TENSOR_WHY", "FLEX_BLOCKS", "FLEX_CPU_MIN_HEAD_DIM", "FLEX_MIN_HEAD_DIM", "AttentionContext",
    "AttentionWindow", "MaskCache", "TemperatureTuning", "attend", "attend_explicitly", "causal_block_mask", "choose_backend",
    "explain_backend", "flex_attention_fn", "flex_available", "flex_block_bytes", "flex_block_ladder", "flex_gradient_loss",
    "flex_min_head_dim", "learnable_score_bias", "narrow_head_error", "probe_flex_gradients",
]
