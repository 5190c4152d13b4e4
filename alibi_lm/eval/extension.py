"""The evaluation's choice of a training-free extension past L (alibi_lm.extension): extension=<method> with its
extension.* keys, or the older position.scaling=<rescaling> (an alias: extension=yarn extension.factor=4 and
position.scaling=yarn position.scaling_factor=4 make the same rows, labelled yarn-x4). Rows carry the method's
label in their rope_scaling column, whatever the scheme, so that reports name a method the same way everywhere."""

from __future__ import annotations

from ..config import RopeScalingConfig
from ..errors import UserError
from ..extension import RESCALINGS, Rescaling, build_extension, method_of
from ..subjects import run_skeleton


def chosen_method(position_cfg: RopeScalingConfig, extension_cfg, train_len: int | None):
    """The ExtensionMethod or Rescaling that the evaluate config asks for, or None."""
    if extension_cfg is not None and position_cfg.scaling is not None:
        raise UserError(f"both extension= and position.scaling={position_cfg.scaling} are set; keep one (position."
                        f"scaling=yarn is the older spelling of extension=yarn)")
    if extension_cfg is None:
        if position_cfg.scaling is None:
            return None
        return build_extension(position_cfg.scaling, {"factor": position_cfg.scaling_factor}, train_len)
    name = method_of(extension_cfg)
    if train_len is None and name not in RESCALINGS:
        raise UserError(f"extension={name} scales its defaults with the training length L, which this model's config "
                        f"does not name; set hf.train_len=<its L>")
    return build_extension(name, extension_cfg, train_len)


def apply_method(scorer, method, eval_len: int) -> str:
    """Set `method` on a loaded model's scorer for evaluation length eval_len; the label its rows carry ('' for
    none). A scheme the method does not fit is refused in one line (UserError)."""
    if method is None:
        return ""
    if isinstance(method, Rescaling):
        try:
            method.set_on(scorer, eval_len)
        except ValueError as e:  # rope's refusal of another scheme, a ConfigError already one line
            raise UserError(str(e)) from None
        return method.label()
    if not hasattr(scorer, "set_extension"):
        raise UserError(f"extension={method.name} needs a model trained by alibi_lm or a Hugging Face Llama-family or "
                        f"BLOOM model; drop extension for this one")
    method.at_length(eval_len)
    scorer.set_extension(method)
    return method.label()


def check_method_fits(run_dir, position_cfg: RopeScalingConfig, extension_cfg) -> None:
    """Preflight: the refusal apply_method would give once the run is loaded (a scheme the method does not fit, a
    model with its own window, a fine-tune's own rescaling, options that do not fit its L), from the run's config
    alone, so that a sweep over runs (-m run=a,b extension=x) stops before its first cell when a later one would
    refuse the method."""
    if extension_cfg is None and position_cfg.scaling is None:
        return
    if (skeleton := run_skeleton(run_dir)) is None:  # loading the run will say why in one line
        return
    scorer, train_len = skeleton
    try:
        apply_method(scorer, chosen_method(position_cfg, extension_cfg, train_len), train_len)
    except (UserError, ValueError) as e:  # a ConfigError is a ValueError; both one line
        raise UserError(f"{run_dir}: {e}") from None
