"""Evaluate a trained run at several evaluation lengths Lv ("train short, test long").

    python -m alibi_lm.evaluate                                   # the latest run under runs/
    python -m alibi_lm.evaluate run=runs/quick/alibi-L64-seed0 eval.multipliers=[1,2,4,8,16]
    python -m alibi_lm.evaluate eval.mode=sliding eval.stride=1 eval.max_tokens=20000
    python -m alibi_lm.evaluate run=hf:<folder> data=wikitext2 eval.lengths=[512,1024]   # alibi_lm/hf.py

Rows go to results/<experiment>/extrapolation.csv (re-evaluating a cell replaces its row), the loss by
position inside the window to results/<experiment>/per_position/, and the report (extrapolation.md,
extrapolation.png) is rebuilt after every evaluation. Each length's row is added as soon as it is scored
(an atomic rewrite of the CSV), so a killed evaluation keeps the lengths it finished and
eval.skip_done=true scores only the rest.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from . import cli, hf, results
from .checkpoint import CHECKPOINT, atomic_write_text, is_run_dir, latest_run, load_checkpoint, read_status
from .config import check_writable, validate_eval_config
from .errors import UserError
from .model import LMConfig, TransformerLM
from .positions import PositionRangeError
from .provenance import git_commit
from .scoring import score_stream


def prepare_data(data_cfg, tokenizer_cfg):
    # Imported on use: evaluation of a saved run needs the data module only here (and tests replace it).
    from .data import prepare_data as _prepare_data

    return _prepare_data(data_cfg, tokenizer_cfg)


def resolve_device(name) -> torch.device:
    name = str(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"device={name} but no CUDA device is visible; use device=auto or device=cpu")
    return torch.device(name)


def eval_lengths(train_len: int, multipliers, lengths) -> list[int]:
    """multipliers x L plus explicit lengths, deduplicated and sorted."""
    return sorted({int(round(m * train_len)) for m in (multipliers or [])} | {int(x) for x in (lengths or [])})


def check_run_dir(run_dir: Path) -> None:
    if not is_run_dir(run_dir):
        what = "does not exist" if not Path(run_dir).exists() else "is not a run folder"
        raise UserError(f"{run_dir} {what}: a run folder holds config.yaml and {CHECKPOINT} "
                        f"(written by python -m alibi_lm.train); pass run=<such a folder>")


def load_run(run_dir: Path, device="cpu") -> tuple[TransformerLM, DictConfig, dict]:
    """(model in eval mode on device, the run's resolved config, the checkpoint dict) with one-line errors."""
    run_dir = Path(run_dir)
    check_run_dir(run_dir)
    try:
        cfg = OmegaConf.load(run_dir / "config.yaml")
        for key in ("name", "seed", "train.seq_len", "data", "tokenizer"):
            if OmegaConf.select(cfg, key) is None:
                raise UserError(f"{run_dir}/config.yaml has no {key}; it was not written by alibi_lm.train")
    except (OmegaConfBaseException, OSError, ValueError) as e:
        raise UserError(f"{run_dir}/config.yaml is not a readable config ({type(e).__name__}); "
                        f"restore it from the checkpoint's 'config' entry or retrain") from None
    state = load_checkpoint(run_dir / CHECKPOINT, map_location="cpu")
    try:
        model = TransformerLM(LMConfig(**state["model_config"]))
        model.load_state_dict(state["model"])
    except (TypeError, ValueError, RuntimeError, KeyError) as e:
        reason = str(e).strip().splitlines()[0][:200]
        raise UserError(f"checkpoint {run_dir / CHECKPOINT} does not match the model config saved with it "
                        f"({reason}); retrain the run or restore its checkpoint") from None
    return model.to(device).eval(), cfg, state


def check_tokenizer(run_dir: Path, data) -> None:
    """The ids must mean what they meant in training: same vocabulary as the run's own tokenizer.json."""
    saved = Path(run_dir) / "tokenizer.json"
    if not saved.is_file() or not hasattr(getattr(data, "tokenizer", None), "get_vocab"):
        return
    from .data import load_tokenizer

    if load_tokenizer(saved).get_vocab() != data.tokenizer.get_vocab():
        raise UserError(f"{saved} differs from the tokenizer built from the run's data/tokenizer config; "
                        f"the data or its cache changed since training, so its token ids would be misread")


def save_per_position(path: Path, position_loss: np.ndarray, count: np.ndarray) -> None:
    df = pd.DataFrame({"position_in_window": np.arange(len(count)), "mean_loss": position_loss, "count": count})
    atomic_write_text(path, df.to_csv(index=False))


def evaluate_run(run_dir, eval_cfg, results_root="results", device="auto", progress: bool = True,
                 skip_done: bool | None = None) -> list[dict]:
    """Score one run at every eval length in eval_cfg; upsert its rows into
    results_root/<experiment>/extrapolation.csv, save per-position losses and rebuild the report.
    skip_done (default eval_cfg.skip_done): leave out lengths whose row is already in the CSV, so an
    interrupted sweep started again scores only what is missing."""
    run_dir = Path(run_dir)
    ev = eval_cfg if isinstance(eval_cfg, DictConfig) else OmegaConf.create(dict(eval_cfg))
    device = resolve_device(device)
    model, cfg, state = load_run(run_dir, device)
    mc = state["model_config"]
    position, L, seed = mc["position"], int(cfg.train.seq_len), int(cfg.seed)
    mode, split = ev.get("mode", "nonoverlapping"), ev.get("split", "valid")
    stride = int(ev.stride) if mode == "sliding" and ev.get("stride") is not None else None
    lengths = eval_lengths(L, ev.get("multipliers"), ev.get("lengths"))
    if not lengths:
        raise UserError("no evaluation lengths: set eval.multipliers=[1,2,4,8] or eval.lengths=[...]")
    if mode == "sliding" and (stride is None or stride > lengths[0]):
        raise UserError(f"eval.stride={stride} must be in [1, {lengths[0]}] (the shortest eval length) "
                        f"with eval.mode=sliding; lower eval.stride or drop the short lengths")
    status = read_status(run_dir)
    if status["status"] != "completed":
        print(f"note: {run_dir} is not a completed run (status: {status['status']}, step {state.get('step')})")

    data = prepare_data(cfg.data, cfg.tokenizer)
    if int(data.vocab_size) != int(mc["vocab_size"]):
        raise UserError(f"the tokenizer gives {data.vocab_size} types but {run_dir}/{CHECKPOINT} was trained with "
                        f"vocab_size={mc['vocab_size']}; the data/tokenizer config or its cache changed since training")
    check_tokenizer(run_dir, data)
    tokens = np.asarray(data.split(split))
    if ev.get("max_tokens") is not None:
        tokens = tokens[: int(ev.max_tokens) + 1]  # max_tokens targets, as train.eval_tokens
    n_targets = len(tokens) - 1
    if n_targets < 1:
        raise UserError(f"the {split} split has {len(tokens)} tokens; nothing to score")

    experiment = str(cfg.name)
    out_dir = Path(results_root) / experiment
    if skip_done if skip_done is not None else ev.get("skip_done", False):
        lengths = [lv for lv in lengths if not results.has_row(out_dir / results.CSV_NAME, dict(
            position=position, train_len=L, eval_len=lv, mode=mode, stride=stride, seed=seed, split=split))]
        if not lengths:
            print(f"{run_dir}: every {mode} length is already in {out_dir / results.CSV_NAME}; skipping")
            report = out_dir / "extrapolation.md"
            if not report.is_file() or report.stat().st_mtime < (out_dir / results.CSV_NAME).stat().st_mtime:
                results.build_report(out_dir)  # a run killed after its last row, before its report
            return []
    per_position = out_dir / "per_position"
    # per_position/<tag>-Lv<Lv>.csv and <tag>.png; a test-split evaluation must not overwrite the valid one
    tag = f"{position}-L{L}-seed{seed}-{mode}" + (f"-s{stride}" if stride else "")
    tag += "" if split == "valid" else f"-{split}"
    autocast = torch.bfloat16 if device.type == "cuda" else None
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    common = dict(position=position, train_len=L, mode=mode, stride=stride, seed=seed, split=split, run=str(run_dir),
                  step=state.get("step"), data=OmegaConf.select(cfg, "data.name"), commit=git_commit(),
                  device=device_name)

    rows, csv_path = [], out_dir / results.CSV_NAME
    bar = tqdm(total=n_targets * len(lengths), unit="tok", unit_scale=True, disable=not progress,
               desc=f"{position} L={L}", dynamic_ncols=True)
    for lv in lengths:
        bar.set_postfix(Lv=lv)
        t0 = time.perf_counter()
        row = dict(common, eval_len=lv, ppl=math.nan, loss=math.nan, tokens=None, note="")
        try:
            model.position.check_positions(lv)  # learned past its table: fail before any work
            r = score_stream(model, tokens, lv, mode, stride, int(ev.get("tokens_per_batch", 16384)), device,
                             autocast, progress=bar)
        except PositionRangeError as e:
            row["note"] = f"not applicable: {e}"
            bar.total -= n_targets
            bar.refresh()
        else:
            row.update(ppl=r.ppl, loss=r.loss, tokens=r.tokens)
            if lv > n_targets:
                row["note"] = f"only {n_targets} targets: scored as one window shorter than Lv"
            save_per_position(per_position / f"{tag}-Lv{lv}.csv", r.position_loss, r.position_count)
        row["wall_s"] = round(time.perf_counter() - t0, 3)
        row["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        rows.append(row)
        results.upsert_rows(csv_path, [row])  # now, not at the end: a kill loses at most this length's work
    bar.close()

    results.plot_per_position(per_position, tag, L)
    results.build_report(out_dir, per_position=False)  # other runs' per-position plots are already up to date
    if progress:
        table = pd.DataFrame(rows)[["eval_len", "ppl", "loss", "tokens", "wall_s", "note"]]
        print(f"\n{run_dir} ({position}, L={L}, {mode}{f' stride {stride}' if stride else ''}, {split}):")
        print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
        print(f"-> {out_dir / results.CSV_NAME}, {out_dir / 'extrapolation.md'}")
    return rows


def task(cfg: DictConfig):
    if hf.is_hf(cfg.run):  # a Hugging Face model: alibi_lm/hf.py
        return hf.evaluate(cfg)
    run_dir = Path(cfg.run) if cfg.run else latest_run(Path(cfg.paths.runs))
    return evaluate_run(run_dir, cfg.eval, cfg.paths.results, device=cfg.device)


def validate(cfg: DictConfig) -> None:
    """The preflight of the evaluate app: eval.* settings, the device, the run folder, the results folder."""
    validate_eval_config(cfg)
    resolve_device(cfg.device)
    if hf.is_hf(cfg.run):
        hf.check(cfg)
    elif cfg.run:
        check_run_dir(Path(cfg.run))
    check_writable(cfg.paths.results, "paths.results")


def main() -> None:
    cli.run("evaluate", task, validate=validate)


if __name__ == "__main__":
    main()
