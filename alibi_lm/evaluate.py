"""Evaluate a trained run at several evaluation lengths Lv ("train short, test long").

    python -m alibi_lm.evaluate                                   # the latest run under runs/
    python -m alibi_lm.evaluate run=runs/quick/alibi-L64-seed0 eval.multipliers=[1,2,4,8,16]
    python -m alibi_lm.evaluate eval.mode=sliding eval.stride=1 eval.max_tokens=20000
    python -m alibi_lm.evaluate run=runs/quick/rope-L64-seed0 position.scaling=yarn   # RoPE extension
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
from .config import EvalConfig, EvalJob, RopeScalingConfig, check_writable, resolve_device, typed
from .data import TokenData, load_tokenizer, prepare_data
from .errors import UserError
from .model import LMConfig, TransformerLM
from .positions import PositionRangeError
from .positions.rope import ROPE_SCALINGS
from .provenance import command_line, device_name, git_commit, repo_relative, weights_digest
from .scoring import score_stream


def eval_lengths(train_len: int, multipliers, lengths) -> list[int]:
    """multipliers x L plus explicit lengths, deduplicated and sorted."""
    return sorted({int(round(m * train_len)) for m in (multipliers or [])} | {int(x) for x in (lengths or [])})


def checked_lengths(ev: EvalConfig, train_len: int, stride: int | None) -> list[int]:
    """The lengths of eval.* for a model trained at train_len; with eval.mode=sliding the stride must not pass the shortest."""
    lengths = eval_lengths(train_len, ev.multipliers, ev.lengths)
    if ev.mode == "sliding" and stride > lengths[0]:
        raise UserError(f"eval.stride={stride} must be in [1, {lengths[0]}] (the shortest eval length) "
                        f"with eval.mode=sliding; lower eval.stride or drop the short lengths")
    return lengths


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


def run_data(run_dir: Path, cfg: DictConfig, state: dict) -> TokenData:
    """A run's data tokenized as in training (load_run's cfg and checkpoint), checked against the vocabulary
    and tokenizer the run was trained with."""
    data, saved_vocab = prepare_data(cfg.data, cfg.tokenizer), int(state["model_config"]["vocab_size"])
    if int(data.vocab_size) != saved_vocab:
        raise UserError(f"the tokenizer gives {data.vocab_size} types but {run_dir}/{CHECKPOINT} was trained "
                        f"with vocab_size={saved_vocab}; the data/tokenizer config or its cache changed since training")
    saved = Path(run_dir) / "tokenizer.json"
    if saved.is_file() and hasattr(getattr(data, "tokenizer", None), "get_vocab"):
        if load_tokenizer(saved).get_vocab() != data.tokenizer.get_vocab():
            raise UserError(f"{saved} differs from the tokenizer built from the run's data/tokenizer config; the "
                            f"data or its cache changed since training, so its token ids would be misread")
    return data


def save_per_position(path: Path, position_loss: np.ndarray, position_count: np.ndarray) -> None:
    """results/<experiment>/per_position/<tag>-Lv<Lv>.csv: the mean loss by position inside the window."""
    per_position = pd.DataFrame({"position_in_window": np.arange(len(position_count)),
                                 "mean_loss": position_loss, "count": position_count})
    atomic_write_text(path, per_position.to_csv(index=False))


class Evaluation:
    """One run scored at every eval length: load(), the lengths still to do, then score() each length,
    adding its row to results/<experiment>/extrapolation.csv at once (a kill loses at most the length
    being scored), and report() the tables and plots. Runs without Hydra (evaluate_run)."""

    def __init__(self, run_dir, eval_cfg: EvalConfig, results_root="results", device="auto", progress=True,
                 skip_done: bool | None = None, position_cfg=None):
        self.run_dir, self.ev = Path(run_dir), typed(EvalConfig, eval_cfg, "eval")
        self.position_cfg = typed(RopeScalingConfig, position_cfg or {}, "position")  # rope_scaling()
        self.results_root, self.progress = Path(results_root), progress
        self.skip_done = self.ev.skip_done if skip_done is None else skip_done
        self.device = resolve_device(str(device))

    def run(self) -> list[dict]:
        self.load()
        lengths = checked_lengths(self.ev, self.L, self.stride)
        if self.skip_done:
            lengths = [lv for lv in lengths if not results.has_row(self.csv, self.key(lv), self.weights, self.data_sha)]
            if not lengths:
                return self.nothing_to_do()
        tokens = self.tokens()
        self.bar = tqdm(total=(len(tokens) - 1) * len(lengths), unit="tok", unit_scale=True,
                        disable=not self.progress, desc=f"{self.position} L={self.L}", dynamic_ncols=True)
        rows = [self.score(lv, tokens) for lv in lengths]
        self.bar.close()
        self.report(rows)
        return rows

    def load(self) -> None:
        """The run's model, config and checkpoint, and what names its rows and files."""
        self.model, self.cfg, self.state = load_run(self.run_dir, self.device)
        self.weights = weights_digest(self.model)  # which weights the rows come from: has_row
        self.data = run_data(self.run_dir, self.cfg, self.state)  # the run's tokenization, checked against it
        # sha256 of the scored split's text (the cache entry's key): which copy of the data set the rows scored
        self.data_sha = self.data.meta["data"][self.ev.split][:16]
        self.position, self.L, self.seed = self.state["model_config"]["position"], int(self.cfg.train.seq_len), int(self.cfg.seed)
        # a scheme other than rope refuses a scaling here, before any work
        self.scaling = rope_scaling(self.model, self.position_cfg, self.L, self.L)
        ev = self.ev
        self.stride = int(ev.stride) if ev.mode == "sliding" and ev.stride is not None else None
        self.out_dir = self.results_root / str(self.cfg.name)
        self.csv = self.out_dir / results.CSV_NAME
        # per_position/<tag>-Lv<Lv>.csv and <tag>.png; a test-split evaluation must not overwrite the valid one
        self.tag = f"{self.position}-L{self.L}-seed{self.seed}-{ev.mode}" + (f"-s{self.stride}" if self.stride else "")
        self.tag += "" if ev.split == "valid" else f"-{ev.split}"
        self.tag += f"-{self.scaling}" if self.scaling else ""
        status = read_status(self.run_dir)
        if status["status"] != "completed":
            print(f"note: {self.run_dir} is not a completed run (status: {status['status']}, step {self.state.get('step')})")

    def key(self, eval_len: int) -> dict:
        """The row's key in the results CSV (results.KEY)."""
        return dict(position=self.position, train_len=self.L, eval_len=eval_len, mode=self.ev.mode, stride=self.stride,
                    seed=self.seed, split=self.ev.split, rope_scaling=self.scaling)

    def nothing_to_do(self) -> list[dict]:
        print(f"{self.run_dir}: every {self.ev.mode} length is already in {self.csv}, from these weights; skipping")
        report = self.out_dir / "extrapolation.md"
        if not report.is_file() or report.stat().st_mtime < self.csv.stat().st_mtime:
            results.build_report(self.out_dir)  # a run killed after its last row, before its report
        return []

    def tokens(self) -> np.ndarray:
        """The split to score, tokenized as in training (the same vocabulary, checked)."""
        tokens = np.asarray(self.data.split(self.ev.split))
        if self.ev.max_tokens is not None:
            tokens = tokens[: int(self.ev.max_tokens) + 1]  # max_tokens targets, as train.eval_tokens
        if len(tokens) < 2:
            raise UserError(f"the {self.ev.split} split has {len(tokens)} tokens; nothing to score")
        return tokens

    def score(self, eval_len: int, tokens: np.ndarray) -> dict:
        """Score one length, save its per-position losses and upsert its row (a learned table shorter than
        eval_len gives a "not applicable" row)."""
        self.bar.set_postfix(Lv=eval_len)
        t0, n_targets = time.perf_counter(), len(tokens) - 1
        row = dict(self.key(eval_len), ppl=math.nan, loss=math.nan, tokens=None, note="", run=repo_relative(self.run_dir),
                   step=self.state.get("step"), weights=self.weights, data=OmegaConf.select(self.cfg, "data.name"),
                   data_sha=self.data_sha, commit=git_commit(), device=device_name(self.device), command=command_line())
        try:
            rope_scaling(self.model, self.position_cfg, self.L, eval_len)  # the factor follows Lv unless given
            self.model.position.check_positions(eval_len)  # learned past its table: fail before any work
            autocast = torch.bfloat16 if self.device.type == "cuda" else None
            r = score_stream(self.model, tokens, eval_len, self.ev.mode, self.stride, self.ev.tokens_per_batch,
                             self.device, autocast, progress=self.bar)
        except PositionRangeError as e:
            row["note"] = f"not applicable: {e}"
            self.bar.total -= n_targets
            self.bar.refresh()
        else:
            row.update(ppl=r.ppl, loss=r.loss, tokens=r.tokens)
            if eval_len > n_targets:
                row["note"] = f"only {n_targets} targets: scored as one window shorter than Lv"
            save_per_position(self.out_dir / "per_position" / f"{self.tag}-Lv{eval_len}.csv", r.position_loss,
                              r.position_count)
        row["wall_s"] = round(time.perf_counter() - t0, 3)
        row["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        results.upsert_rows(self.csv, [row])  # now, not at the end: a kill loses at most this length's work
        return row

    def report(self, rows: list[dict]) -> None:
        results.plot_per_position(self.out_dir / "per_position", self.tag, self.L)
        results.build_report(self.out_dir, per_position=False)  # other runs' per-position plots are up to date
        if self.progress:
            ev, stride = self.ev, f" stride {self.stride}" if self.stride else ""
            table = pd.DataFrame(rows)[["eval_len", "ppl", "loss", "tokens", "wall_s", "note"]]
            scaling = f" + {self.scaling}" if self.scaling else ""
            print(f"\n{self.run_dir} ({self.position}{scaling}, L={self.L}, {ev.mode}{stride}, {ev.split}):")
            print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
            print(f"-> {self.csv}, {self.out_dir / 'extrapolation.md'}")


def rope_scaling(model: TransformerLM, position_cfg: RopeScalingConfig, train_len: int, eval_len: int) -> str:
    """Set the inference-time RoPE extension of position_cfg (scaling: linear | ntk | dynamic | yarn,
    scaling_factor: null for max(1, Lv / L), or 1 for dynamic) on a loaded model for one evaluation length; return the
    label its results rows carry in the rope_scaling column ('' without one, 'yarn', or 'yarn-x4'
    with a given factor). Schemes other than rope refuse a scaling with a one-line UserError."""
    method, factor = position_cfg.scaling, position_cfg.scaling_factor
    if method is None and factor is not None:
        raise UserError(f"position.scaling_factor={factor} needs position.scaling (one of {', '.join(ROPE_SCALINGS)})")
    try:
        # dynamic NTK grows its base with the current length itself (b (s n / L - (s - 1))^(d / (d - 2))):
        # its default s is 1, which is NTK at s = n / L; s = Lv / L on top would count the length twice
        default = 1.0 if method == "dynamic" else max(1.0, eval_len / train_len)
        model.position.set_scaling(method, default if factor is None else factor, train_len)
    except ValueError as e:
        raise UserError(str(e)) from None
    if method is None:
        return ""
    return str(method) if factor is None else f"{method}-x{float(factor):g}"


def evaluate_run(run_dir, eval_cfg, results_root="results", device="auto", progress: bool = True,
                 skip_done: bool | None = None, position_cfg=None) -> list[dict]:
    """Evaluation(...).run(): upsert the run's rows into results_root/<experiment>/extrapolation.csv, save its
    per-position losses, rebuild the report. eval_cfg is an EvalConfig or a dict of eval.* keys, position_cfg the
    RoPE extension (rope_scaling()); skip_done (default eval_cfg.skip_done) scores only lengths not yet in the
    CSV, so that an interrupted sweep started again does only what is missing."""
    return Evaluation(run_dir, eval_cfg, results_root, device, progress, skip_done, position_cfg).run()


def evaluate(job: EvalJob, output_dir=None) -> list[dict]:
    if hf.is_hf(job.run):  # a Hugging Face model: alibi_lm/hf.py
        return hf.evaluate(job)
    run_dir = Path(job.run) if job.run else latest_run(Path(job.paths.runs))
    return evaluate_run(run_dir, job.eval, job.paths.results, device=job.device, position_cfg=job.position)


def check(job: EvalJob, output_dir=None) -> None:
    """The preflight of the evaluate app: the device, the run folder (or run=hf:'s model and data), the
    results folder."""
    resolve_device(job.device)
    if hf.is_hf(job.run):
        hf.check(job)
    elif job.run:
        check_run_dir(Path(job.run))
    check_writable(job.paths.results, "paths.results")


def main() -> None:
    cli.main("evaluate", evaluate, check)


if __name__ == "__main__":
    main()
