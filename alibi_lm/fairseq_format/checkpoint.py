"""A fairseq `transformer_lm` checkpoint (the ALiBi fork of Press et al.) as an LMConfig and a state dict.

The file is read with torch's restricted unpickler (weights_only=True), which admits tensors and plain
containers; the one other type allowed is argparse.Namespace, by name, which older fairseq files hold in
`args`. A file that needs anything else is refused: its payload never runs, and nothing falls back to a
full unpickle.

What is mapped (fairseq name -> alibi_lm.model name), for the decoder the official fork builds:
    embed_tokens.embeddings.i.0 (V_i, D_i)  -> vocab.tables.i          adaptive input, band i's table
    embed_tokens.embeddings.i.1 (D, D_i)    -> vocab.projections.i     band i's Linear D_i -> D (band 0 too)
    adaptive_softmax.head.class_proj        -> vocab.cluster_logits    the only untied softmax weight
    adaptive_softmax.head.word_proj         == embeddings.0.0          tied: checked equal, not copied
    adaptive_softmax.tail.i.0 / tail.i.2    == embeddings.i+1.1 / .0   tied: checked equal, not copied
    layers.N.self_attn.{q,k,v}_proj         -> blocks.N.attn.qkv       stacked q, k, v (the model's order)
    layers.N.self_attn.out_proj             -> blocks.N.attn.out
    layers.N.self_attn_layer_norm / final_layer_norm -> blocks.N.ln_attn / ln_mlp
    layers.N.fc1 / fc2                      -> blocks.N.mlp.fc_in / fc_out
    layer_norm (only without no_decoder_final_norm) -> ln_f
ALiBi's slopes are not in the file (the fork builds them from the head count); alibi_lm's alibi_slopes
gives the official ones for any head count. `version` and `_float_tensor` entries are placeholders.

A file does not say that it comes from the ALiBi fork: a plain fairseq transformer_lm with sinusoidal positions
has the same keys and cfg (its positions are not in the state dict either). Such a file would be imported as
ALiBi and score wrongly; only import the fork's checkpoints (the paper's alibi_wt103_L*.pt).
"""

from __future__ import annotations

import argparse
import pickle
import re
from pathlib import Path

import torch

from ..errors import UserError
from ..model import LMConfig

PLACEHOLDERS = ("version", "_float_tensor")
DECODER = "decoder."


def load_fairseq(path: Path) -> dict:
    """The checkpoint dict, read with the restricted unpickler (plus argparse.Namespace); one-line errors."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"no fairseq checkpoint at {path}; pass the .pt file (e.g. alibi_wt103_L512.pt)")
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        refused = re.search(r"GLOBAL ([\w.]+)", str(e))
        if refused:
            raise UserError(f"{path} refused: it needs the global {refused.group(1)}, which the restricted unpickler "
                            f"does not load (nothing in the file was run); use an official checkpoint") from None
        raise UserError(f"{path} is not a torch checkpoint, or it is truncated or corrupt "
                        f"({first_line(e)}); download it again") from None
    except Exception as e:  # noqa: BLE001 - a damaged archive raises RuntimeError, EOFError, OSError, ...
        raise UserError(f"{path} is not a torch checkpoint, or it is truncated or corrupt ({type(e).__name__}: "
                        f"{first_line(e)}); download it again") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise UserError(f"{path} has no 'model' state dict: it is not a fairseq checkpoint; pass the .pt file that "
                        f"fairseq-train saved")
    return state


def first_line(e: Exception) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0][:120] if lines else type(e).__name__


def model_args(state: dict, path: Path) -> dict:
    """The architecture values: cfg['model'] (fairseq >= 0.10, a plain dict), else the argparse `args`."""
    cfg = state.get("cfg")
    if isinstance(cfg, dict) and isinstance(cfg.get("model"), dict):
        args = dict(cfg["model"])
        args.setdefault("arch", args.get("_name"))
    elif isinstance(state.get("args"), argparse.Namespace):
        args = vars(state["args"])
    else:
        raise UserError(f"{path} has neither cfg['model'] nor args: no architecture to read; pass a checkpoint "
                        f"that fairseq-train saved")
    if not str(args.get("arch") or "").startswith("transformer_lm"):
        raise UserError(f"{path} is a {args.get('arch')!r} model, not a fairseq transformer_lm; only the decoder-only "
                        f"language models (e.g. transformer_lm_wiki103) can be imported")
    return args


def train_len(state: dict, args: dict, path: Path) -> int:
    """L, the training length: the task's tokens_per_sample."""
    task = (state.get("cfg") or {}).get("task") or {}
    value = task.get("tokens_per_sample") or args.get("tokens_per_sample")
    if not value:
        raise UserError(f"{path} records no tokens_per_sample (the training length L); it is not a language-model "
                        f"checkpoint of fairseq-train")
    return int(value)


def training_seed(state: dict, args: dict) -> int:
    common = (state.get("cfg") or {}).get("common") or {}
    return int(common.get("seed") or args.get("seed") or 1)  # fairseq's default seed is 1


def num_updates(state: dict) -> int | None:
    history = state.get("optimizer_history") or []
    return int(history[-1]["num_updates"]) if history and "num_updates" in history[-1] else None


def cutoffs(args: dict, key: str, path: Path) -> list[int]:
    value = args.get(key)
    if not value:
        raise UserError(f"{path} has no {key}: alibi-lm imports the adaptive-input / adaptive-softmax models "
                        f"(the paper's transformer_lm_wiki103), which record it, e.g. '20000,60000'")
    return [int(c) for c in str(value).split(",")] if not isinstance(value, (list, tuple)) else [int(c) for c in value]


def lm_config(args: dict, weights: dict, vocab_size: int, path: Path) -> LMConfig:
    """The LMConfig of the checkpoint's architecture; every value alibi-lm cannot express is refused by name."""
    refuse = {
        "decoder_normalize_before": (False, "post-LayerNorm blocks"),
        "adaptive_input": (False, "a plain input embedding"),
        "tie_adaptive_weights": (False, "an adaptive softmax not tied to the adaptive input"),
        "tie_adaptive_proj": (False, "untied adaptive projections"),
        "decoder_learned_pos": (True, "learned position embeddings"),
        "layernorm_embedding": (True, "a LayerNorm on the embeddings"),
        "character_embeddings": (True, "character embeddings"),
        "cross_self_attention": (True, "cross+self attention"),
    }
    for key, (bad, what) in refuse.items():
        if bool(args.get(key, not bad)) == bad:
            raise UserError(f"{path} has {key}={bad} ({what}), which alibi-lm's model cannot express; only the "
                            f"paper's transformer_lm_wiki103 layout (pre-LN, adaptive input tied to the softmax) imports")
    d_model = int(args.get("decoder_embed_dim") or 0)
    for key in ("decoder_input_dim", "decoder_output_dim"):
        if args.get(key) not in (None, d_model):
            raise UserError(f"{path} has {key}={args[key]} != decoder_embed_dim={d_model} (a projection alibi-lm "
                            f"does not have); it cannot be imported")
    bands = cutoffs(args, "adaptive_input_cutoff", path)
    if bands != cutoffs(args, "adaptive_softmax_cutoff", path):
        raise UserError(f"{path}: adaptive_input_cutoff {bands} differs from adaptive_softmax_cutoff; tied weights "
                        f"need the same bands")
    factor = float(args.get("adaptive_input_factor", 4))
    if factor != float(args.get("adaptive_softmax_factor", factor)) or factor != int(factor):
        raise UserError(f"{path}: adaptive factors {factor} / {args.get('adaptive_softmax_factor')} must be one "
                        f"integer for tied weights")
    n_layer = len({k.split(".")[1] for k in weights if k.startswith("layers.")})  # decoder_weights: at least one
    if "decoder_attention_heads" not in args:
        raise UserError(f"{path} records no decoder_attention_heads (ALiBi's slopes follow the head count); "
                        f"it cannot be imported")
    return LMConfig(
        vocab_size=vocab_size, n_layer=n_layer, n_head=int(args["decoder_attention_heads"]), d_model=d_model,
        d_ff=int(args.get("decoder_ffn_embed_dim") or 4 * d_model), dropout=float(args.get("dropout", 0.0)),
        attn_dropout=float(args.get("attention_dropout", 0.0)), activation=str(args.get("activation_fn", "relu")),
        activation_dropout=float(args.get("activation_dropout") or args.get("relu_dropout") or 0.0),
        final_norm=not bool(args.get("no_decoder_final_norm", False)), init="fairseq", bias=True, position="alibi",
        embed_scale=1.0 if args.get("no_scale_embedding") else None, adaptive_cutoffs=bands, adaptive_factor=int(factor),
        adaptive_softmax_dropout=float(args.get("adaptive_softmax_dropout", 0.0)),
    )  # fmt: skip


def decoder_weights(state: dict, path: Path) -> dict[str, torch.Tensor]:
    """The decoder's tensors without the `decoder.` prefix and the placeholders."""
    weights = {k.removeprefix(DECODER): v for k, v in state["model"].items()
               if k.startswith(DECODER) and not k.endswith(PLACEHOLDERS)}
    if not any(k.startswith("layers.") for k in weights):
        raise UserError(f"{path} has no decoder.layers.* weights: it is not a fairseq transformer_lm checkpoint")
    bad = [k for k, v in weights.items() if not isinstance(v, torch.Tensor) or not v.is_floating_point()]
    if bad:
        raise UserError(f"{path}: decoder.{bad[0]} is not a floating-point tensor; the checkpoint is damaged or not fairseq's")
    return weights


def band_sizes(weights: dict, path: Path) -> list[int]:
    """Rows of each adaptive-input band's table; their sum is the vocabulary size."""
    sizes, i = [], 0
    while f"embed_tokens.embeddings.{i}.0.weight" in weights:
        sizes.append(weights[f"embed_tokens.embeddings.{i}.0.weight"].shape[0])
        i += 1
    if not sizes:
        raise UserError(f"{path} has no decoder.embed_tokens.embeddings.* (adaptive input) weights; only adaptive-input "
                        f"transformer_lm checkpoints (the paper's) can be imported")
    return sizes


def map_weights(weights: dict, cfg: LMConfig, path: Path) -> dict[str, torch.Tensor]:
    """alibi_lm.model's state dict (float32) from the decoder's tensors; every tensor is used or refused."""
    take = dict(weights)

    def pop(name):
        if name not in take:
            raise UserError(f"{path} lacks decoder.{name}, which a {cfg.n_layer}-layer transformer_lm with "
                            f"{len(cfg.adaptive_cutoffs) + 1} adaptive bands has; the checkpoint is incomplete")
        return take.pop(name).float()

    def tied(name, to, what):
        if not torch.equal(pop(name), to):
            raise UserError(f"{path}: decoder.{name} differs from {what}; alibi-lm ties the adaptive softmax to the "
                            f"adaptive input (tie_adaptive_weights, tie_adaptive_proj), so it cannot import this model")

    out = {}
    for i in range(len(cfg.adaptive_cutoffs) + 1):
        out[f"vocab.tables.{i}"] = pop(f"embed_tokens.embeddings.{i}.0.weight")  # (V_i, D_i)
        out[f"vocab.projections.{i}"] = pop(f"embed_tokens.embeddings.{i}.1.weight")  # (D, D_i)
    out["vocab.cluster_logits.weight"] = pop("adaptive_softmax.head.class_proj.weight")  # (n_tails, D)
    tied("adaptive_softmax.head.word_proj.weight", out["vocab.tables.0"], "band 0's embedding")
    for i in range(len(cfg.adaptive_cutoffs)):
        tied(f"adaptive_softmax.tail.{i}.0.weight", out[f"vocab.projections.{i + 1}"], f"band {i + 1}'s projection")
        tied(f"adaptive_softmax.tail.{i}.2.weight", out[f"vocab.tables.{i + 1}"], f"band {i + 1}'s embedding")
    for n in range(cfg.n_layer):
        fs, me = f"layers.{n}.", f"blocks.{n}."
        for part in ("weight", "bias"):
            # (3D, D) / (3D,): queries, keys, values stacked as CausalSelfAttention splits them
            out[me + f"attn.qkv.{part}"] = torch.cat([pop(fs + f"self_attn.{p}_proj.{part}") for p in "qkv"])
            for mine, theirs in (("attn.out", "self_attn.out_proj"), ("ln_attn", "self_attn_layer_norm"),
                                 ("ln_mlp", "final_layer_norm"), ("mlp.fc_in", "fc1"), ("mlp.fc_out", "fc2")):
                out[me + f"{mine}.{part}"] = pop(fs + f"{theirs}.{part}")
    if cfg.final_norm:
        out["ln_f.weight"], out["ln_f.bias"] = pop("layer_norm.weight"), pop("layer_norm.bias")
    if take:
        raise UserError(f"{path} holds decoder.{sorted(take)[0]}, which alibi-lm's model has no place for "
                        f"({len(take)} such tensors); the checkpoint is not the paper's transformer_lm layout")
    return out


def read_model(path: Path, vocab_size: int | None = None):
    """(state, args, LMConfig, alibi_lm state dict in float32, source dtype) of a fairseq checkpoint."""
    state = load_fairseq(path)
    args = model_args(state, path)
    weights = decoder_weights(state, path)
    sizes = band_sizes(weights, path)
    if vocab_size is not None and sum(sizes) != vocab_size:
        raise UserError(f"{path} has {sum(sizes):,} token ids but the dictionary gives {vocab_size:,}; pass the "
                        f"dict.txt the model was trained with (--dict)")
    cfg = lm_config(args, weights, sum(sizes), path)
    edges = [0, *cfg.adaptive_cutoffs, cfg.vocab_size]
    if [b - a for a, b in zip(edges, edges[1:])] != sizes:
        raise UserError(f"{path}: the adaptive bands hold {sizes} ids, the cutoffs {cfg.adaptive_cutoffs} say otherwise; "
                        f"the checkpoint is inconsistent")
    dtypes = sorted({str(v.dtype).removeprefix("torch.") for v in weights.values()})
    return state, args, cfg, map_weights(weights, cfg, path), "/".join(dtypes)
