"""Evaluation: one model under test (a Subject) scored at several evaluation lengths Lv ("train short,
test long"); the evaluate app (app.py) and training's evaluate_after (evaluate_run) run it.

Rows go to results/<experiment>/extrapolation.csv (re-evaluating a cell replaces its row), the loss by
position inside the window to results/<experiment>/per_position/, and the report (extrapolation.md,
extrapolation.png) is rebuilt after every evaluation. Each length's row is added as soon as it is scored
(an atomic rewrite of the CSV), so a killed evaluation keeps the lengths it finished and
eval.skip_done=true scores only the rest. A Hugging Face model whose config names no training length
(BLOOM) is scored at eval.lengths only: its rows have no L, and the report gives no ratios to L for them.
"""

from __future__ import annotations

import math
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm import tqdm

from ..checkpoint import atomic_write_text
from ..config import EvalConfig, RopeScalingConfig, resolve_device, typed
from ..costs import FirstBatchEstimate
from ..errors import UserError
from ..positions.rope import scaling_factor, scaling_label
from ..provenance import command_line
from ..results import store
from ..results.learned_values import LEARNED_CSV, learned_recorded, record_learned
from ..results.plots import plot_per_position
from ..results.report import build_report
from ..subjects import NOT_APPLICABLE, Subject, open_native
from .extension import apply_method, chosen_method
from .scoring import KeyTokens, eval_lengths, perplexity, plan_cost, score_stream, short_context_nll
from .task_evaluation import TaskEvaluation, evaluate_task_run


def rows_text(rows: list[dict], columns: list[str]) -> str:
    """The rows as the app prints them: counts as integers (a length not applicable leaves its count empty, which
    would turn the column into floats: 2048.000), the rest to 3 decimals."""
    table = pd.DataFrame(rows).reindex(columns=columns)
    counts = {c: "Int64" for c in ("eval_len", "tokens") if c in table}
    return table.astype(counts).to_string(index=False, float_format=lambda v: f"{v:.3f}")


class Evaluation:
    """One model under test (a Subject: a trained run or run=hf:<folder>) scored at every eval length: the
    lengths still to do, then score() each, adding its row to results/<experiment>/extrapolation.csv at once
    (a kill loses at most the length being scored), and report() the tables and plots. Runs without Hydra
    (evaluate_run)."""

    def __init__(self, subject: Subject, eval_cfg: EvalConfig, progress=True, skip_done: bool | None = None,
                 position_cfg=None, extension_cfg=None):
        self.subject, self.ev = subject, typed(EvalConfig, eval_cfg, "eval")
        self.position_cfg = typed(RopeScalingConfig, position_cfg or {}, "position")  # rope_scaling()
        self.progress, self.skip_done = progress, self.ev.skip_done if skip_done is None else skip_done
        ev, identity = self.ev, subject.identity
        self.position, self.L, self.seed = identity["position"], identity["train_len"], identity["seed"]
        self.stride = int(ev.stride) if ev.mode == "sliding" and ev.stride is not None else None
        # an extension past L (eval/extension.py); a scheme it does not fit refuses it here, before any work
        self.method = chosen_method(self.position_cfg, extension_cfg, self.L)
        self.scaling = apply_method(subject.scorer, self.method, self.L)
        self.key_tokens = None  # LongPPL's cut-context losses (eval.longppl), computed by run()
        self.attention = attention_label(blockwise_attention(subject.scorer, ev.attention, self.L),
                                         temperature_tuning(subject.scorer, ev, self.L))
        self.data_sha = subject.split_sha(ev.split)  # which copy of the data set the rows scored
        self.csv = subject.out_dir / store.CSV_NAME
        # per_position/<tag>-Lv<Lv>.csv and <tag>.png; a test-split evaluation must not overwrite the valid one
        name, seed = self.position.replace(":", "-"), "NA" if self.seed is None else self.seed  # hf:gpt2 -> hf-gpt2
        L = "unknown" if self.L is None else self.L
        self.tag = f"{name}-L{L}-seed{seed}-{ev.mode}" + (f"-s{self.stride}" if self.stride else "")
        self.tag += ("" if ev.split == "valid" else f"-{ev.split}") + (f"-{self.scaling}" if self.scaling else "")
        self.tag += "" if self.attention == "full" else f"-{self.attention}"

    def run(self) -> list[dict]:
        if not self.subject.completed:
            print(f"note: {self.subject.provenance['run']} is not a completed run (step {self.subject.provenance['step']})")
        lengths = self.lengths_to_score()
        if not lengths:
            return self.nothing_to_do()
        tokens, L = self.tokens(), "unknown" if self.L is None else self.L
        self.check_same_budget(lengths, len(tokens) - 1)
        self.check_same_model(lengths)
        self.costs = {lv: plan_cost(len(tokens), lv, self.ev.mode, self.stride, int(self.ev.tokens_per_batch))
                      for lv in lengths}
        print(self.plan(len(tokens) - 1))
        # the bar counts tokens through the model, so that its ETA holds across lengths and protocols
        self.bar = tqdm(total=sum(c.tokens for c in self.costs.values()), unit="tok", unit_scale=True,
                        disable=not self.progress, desc=f"{self.position} L={L}", dynamic_ncols=True)
        caveat = f" (at Lv = {lengths[0]}; longer windows cost more per token)" if len(lengths) > 1 else ""
        self.estimate = FirstBatchEstimate(self.bar, "tokens through the model", caveat)
        if self.ev.longppl:
            self.key_tokens = self.cut_context_losses(tokens)
        rows = [self.score(lv, tokens) for lv in lengths]
        self.bar.close()
        self.report(rows)
        return rows

    def cut_context_losses(self, tokens: np.ndarray) -> KeyTokens:
        """eval.longppl: every target's loss with its context cut to L (scoring.short_context_nll), the model and
        its extension set for Lv = L, as LongPPL's evaluator (the model itself)."""
        if self.L is None:
            raise UserError("eval.longppl cuts the context to the training length L, which this model's config does not "
                            "name; set hf.train_len=<its L>")
        apply_method(self.subject.scorer, self.method, self.L)
        short = short_context_nll(self.subject.scorer, tokens, self.L, self.ev.tokens_per_batch, self.subject.device,
                                  self.subject.dtype)
        return KeyTokens(short, self.L, self.ev.longppl_alpha, self.ev.longppl_beta)

    def lengths_to_score(self) -> list[int]:
        """lengths(), less those in the CSV from these weights and data that scored as many targets as this evaluation
        does (with skip_done): a row of another eval.max_tokens is not this evaluation's, and run() then refuses to
        replace it (check_same_budget)."""
        if not self.skip_done:
            return self.lengths()
        weights, done = self.subject.provenance["weights"], store.scored_targets(self.csv)
        found = {lv: done.get(store.scored_key(self.key(lv), weights, self.data_sha)) for lv in self.lengths()}
        if all(targets is None for targets in found.values()):
            return list(found)
        wanted = self.targets()
        return [lv for lv, targets in found.items() if targets is None or not (math.isnan(targets) or targets == wanted)]

    def targets(self) -> int:
        """How many targets run() scores: the split's tokens (at most eval.max_tokens + 1: tokens()) less the first."""
        n = len(self.subject.tokens(self.ev.split))  # a memory map of the token cache
        return (n if self.ev.max_tokens is None else min(n, int(self.ev.max_tokens) + 1)) - 1

    def pending(self) -> bool:
        """Whether run() would score or write anything: a length to score, or a report older than its rows."""
        return bool(self.lengths_to_score()) or self.report_stale()

    def report_stale(self) -> bool:
        report, learned = self.csv.parent / "extrapolation.md", self.csv.parent / LEARNED_CSV
        newest = max((p.stat().st_mtime for p in (self.csv, learned) if p.is_file()), default=None)
        return newest is not None and (not report.is_file() or report.stat().st_mtime < newest)

    def check_same_budget(self, lengths: list[int], n_targets: int) -> None:
        """A cell already in the CSV is replaced only by a row that scores as many targets: a row from another
        eval.max_tokens (a quick trial on a committed experiment's run) must not replace one of the whole split,
        or the other way round, since the key does not tell them apart."""
        old = store.read_results(self.csv)
        if old.empty:
            return
        keys = store.row_keys(old, store.KEY)
        for lv in lengths:
            wanted = tuple(store.key_text({**store.OPTIONAL_KEY, **self.key(lv)}[k]) for k in store.KEY)
            counts = old.loc[keys == wanted, "tokens"].dropna()
            if len(counts) and int(counts.iloc[0]) != n_targets:
                raise UserError(f"{self.csv} holds the cell Lv={lv} of {self.position} scored on {int(counts.iloc[0]):,} "
                                f"targets; this evaluation scores {n_targets:,} (another eval.max_tokens), and would "
                                f"replace it: write elsewhere with paths.results=<folder>, or use that budget")

    def lengths(self) -> list[int]:
        """multipliers x L plus eval.lengths; eval.lengths alone where L is not known (a Hugging Face model whose
        config names none, such as BLOOM's)."""
        lengths = eval_lengths(self.L, self.ev.multipliers, self.ev.lengths)
        if self.L is None and not lengths:
            raise UserError(f"{self.position}'s config names no training length; set hf.train_len=<its L> or give "
                            f"the lengths: eval.lengths=[...]")
        if self.L is None and self.ev.multipliers:  # a Hugging Face model whose config names no L (BLOOM)
            print(f"note: {self.position} names no training length: scoring eval.lengths only, without ratios to L "
                  f"(set hf.train_len for eval.multipliers)")
        if self.stride and self.stride > lengths[0]:
            raise UserError(f"eval.stride={self.stride} must be in [1, {lengths[0]}] (the shortest eval length) "
                            f"with eval.mode=sliding; lower eval.stride or drop the short lengths")
        return lengths

    def plan(self, n_targets: int) -> str:
        """The line printed before the work: windows and forward passes per length (scoring.plan_cost)."""
        ev, stride = self.ev, f" stride {self.stride}" if self.stride else ""
        per_length = "; ".join(f"Lv={lv}: {c.windows:,} windows in {c.forwards:,} forward passes"
                               for lv, c in self.costs.items())
        total = sum(c.tokens for c in self.costs.values())
        return (f"plan: {n_targets:,} targets of the {ev.split} split at {len(self.costs)} length(s), {ev.mode}{stride}: "
                f"{per_length}; {total:,} tokens through the model in all")

    def check_same_model(self, lengths: list[int]) -> None:
        """Before any length is scored: the table holds no other model's row in a cell this evaluation would write
        (the same refusal as the write's, store.check_same_model), so that nothing is scored, and no per-position
        file replaced, for a row that would then be refused."""
        if model := self.subject.provenance.get("model"):
            store.check_planned_rows(self.csv, [dict(self.key(lv), model=model) for lv in lengths])
        if self.subject.note and self.csv.is_file():  # a run that did not finish, scored on purpose
            self.check_no_finished_rows()

    def check_no_finished_rows(self) -> None:
        """An unfinished run never stands in for another training of it: where the table holds rows of this scheme,
        L and seed from other weights (a finished training's, as a plan commits them), one line refuses instead of
        replacing them (a run trained again to the end replaces them, as before)."""
        old = store.read_results(self.csv)
        mine = pd.Series(True, index=old.index)
        for key, value in (("position", self.position), ("train_len", self.L), ("seed", self.seed)):
            mine &= old[key].map(store.key_text) == store.key_text(value)
        store.check_no_other_weights(self.csv, old[mine]["weights"], self.subject.provenance, self.subject.note)

    def key(self, eval_len: int) -> dict:
        """The row's key in the results CSV (store.KEY)."""
        return dict(position=self.position, train_len=self.L, eval_len=eval_len, mode=self.ev.mode, stride=self.stride,
                    seed=self.seed, split=self.ev.split, rope_scaling=self.scaling, attention=self.attention)

    def nothing_to_do(self) -> list[dict]:
        print(f"{self.subject.provenance['run']}: every {self.ev.mode} length is already in {self.csv}, from these "
              f"weights; skipping")
        if self.report_stale():
            build_report(self.csv.parent)  # a run killed after its last row, before its report
        return []

    def tokens(self) -> np.ndarray:
        """The split to score, as the model reads it (a trained run: its own tokenization, checked), and
        the word-level count of its targets for a Hugging Face model (word_ppl; none for part of a split)."""
        tokens, count = self.subject.tokens(self.ev.split), None
        if self.ev.max_tokens is None:  # a whole split: word_ppl for a subject that counts its words
            count = self.subject.word_count(self.ev.split)
        self.words = count - 1 if count else None  # the first: no target
        if self.ev.max_tokens is not None:
            tokens = tokens[: int(self.ev.max_tokens) + 1]  # max_tokens targets, as train.eval_tokens
        if len(tokens) < 2:
            raise UserError(f"the {self.ev.split} split has {len(tokens)} tokens; nothing to score")
        return tokens

    def score(self, eval_len: int, tokens: np.ndarray) -> dict:
        """Score one length, save its per-position losses and upsert its row (a learned table shorter than
        eval_len gives a "not applicable" row)."""
        self.bar.set_postfix(Lv=eval_len)
        subject, t0, n_targets = self.subject, time.perf_counter(), len(tokens) - 1
        row = dict(self.key(eval_len), ppl=math.nan, loss=math.nan, tokens=None, note="", **subject.provenance,
                   data_sha=self.data_sha, command=command_line())
        per_position = None  # a not-applicable length has none
        try:
            apply_method(subject.scorer, self.method, eval_len)  # a factor or group that follows Lv unless given
            subject.scorer.check_positions(eval_len)  # learned past its table: fail before any work
            r = score_stream(subject.scorer, tokens, eval_len, self.ev.mode, self.stride, self.ev.tokens_per_batch,
                             subject.device, subject.dtype, progress=self.estimate, key=self.key_tokens)
        except NOT_APPLICABLE as e:  # IndexError: a Hugging Face table that hf.LEARNED_TABLES does not name
            row["note"] = f"not applicable: {str(e).splitlines()[0]}"
            self.bar.total -= self.costs[eval_len].tokens
            self.bar.refresh()
        else:
            row.update(ppl=r.ppl, loss=r.loss, tokens=r.tokens)
            if r.key_tokens is not None:
                row.update(key_ppl=r.key_ppl, key_tokens=r.key_tokens, longppl_alpha=self.ev.longppl_alpha,
                           longppl_beta=self.ev.longppl_beta)
            if self.words:
                row.update(words=self.words, word_ppl=perplexity(r.loss * r.tokens / self.words))
            if eval_len > n_targets:
                row["note"] = f"only {n_targets} targets: scored as one window shorter than Lv"
            if not math.isfinite(r.loss):  # the row says why it has no perplexity, so the table keeps taking rows
                row.update(ppl=math.nan, note="; ".join(filter(None, (row["note"], f"loss not finite ({r.loss})"))))
            per_position = pd.DataFrame({"position_in_window": np.arange(len(r.position_loss)), "mean_loss": r.position_loss,
                                         "count": r.position_count})  # the loss by position inside the window
        row["wall_s"] = round(time.perf_counter() - t0, 3)
        row["timestamp"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        row["note"] = "; ".join(filter(None, (subject.note, row["note"])))  # a failed run scored on purpose says so
        store.upsert_rows(self.csv, [row])  # now, not at the end: a kill loses at most this length's work
        if per_position is not None:  # after its row, which refuses another model's cell: the file is this row's
            per_position_csv = self.csv.parent / "per_position" / f"{self.tag}-Lv{eval_len}.csv"
            atomic_write_text(per_position_csv, per_position.to_csv(index=False))
        return row

    def report(self, rows: list[dict]) -> None:
        plot_per_position(self.csv.parent / "per_position", self.tag, self.L)
        build_report(self.csv.parent, per_position=False)  # other runs' per-position plots are up to date
        if self.progress:
            ev, stride = self.ev, f" stride {self.stride}" if self.stride else ""
            columns = ["eval_len", "ppl", "loss", "tokens", *(["word_ppl"] if self.words else []), "wall_s", "note"]
            scaling = f" + {self.scaling}" if self.scaling else ""
            L = "unknown" if self.L is None else self.L
            print(f"\n{self.subject.provenance['run']} ({self.position}{scaling}, L={L}, {ev.mode}{stride}, {ev.split}):")
            print(rows_text(rows, columns))
            print(f"-> {self.csv}, {self.csv.parent / 'extrapolation.md'}")


def blockwise_attention(scorer, attention: str, train_len: int | None) -> str:
    """eval.attention on a loaded model's scorer: full, or bca (blocks of L, the xPos paper's evaluation; the model
    restricts every layer's attention, model.TransformerLM.attention_window); the label its rows carry."""
    if attention == "full":
        return attention
    if train_len is None or not hasattr(scorer, "set_attention_window"):
        raise UserError("eval.attention=bca needs a model trained by alibi_lm with a known L (blocks of L tokens); "
                        "drop eval.attention for this model")
    scorer.set_attention_window(attention, train_len)
    return attention


def temperature_tuning(scorer, ev: EvalConfig, train_len: int | None) -> str:
    """eval.temperature_tuning on a loaded model's scorer; '' without it, else the label its rows carry:
    temperature (attn_scale 0.1, floor_scale L), or temperature-a<attn_scale>-f<floor_scale> for other values."""
    if not ev.temperature_tuning:
        return ""
    floor_scale = ev.floor_scale if ev.floor_scale is not None else train_len
    if floor_scale is None or not hasattr(scorer, "set_temperature_tuning"):
        raise UserError("eval.temperature_tuning needs a model trained by alibi_lm (its L is the default floor_scale); "
                        "drop eval.temperature_tuning for this model")
    scorer.set_temperature_tuning(int(floor_scale), float(ev.attn_scale))
    default = ev.attn_scale == EvalConfig.attn_scale and floor_scale == train_len
    return "temperature" if default else f"temperature-a{ev.attn_scale:g}-f{floor_scale}"


def attention_label(window: str, temperature: str) -> str:
    """The rows' attention column: full, bca, temperature, bca+temperature."""
    if not temperature:
        return window
    return temperature if window == "full" else f"{window}+{temperature}"


def rope_scaling(scorer, position_cfg: RopeScalingConfig, train_len: int, eval_len: int) -> str:
    """Set the inference-time RoPE extension of position_cfg (checked by the rope scheme, positions/rope.py) on
    a loaded model's scorer for one evaluation length; return the label its results rows carry in the
    rope_scaling column. Schemes other than rope refuse a scaling with a one-line UserError."""
    method, factor = position_cfg.scaling, position_cfg.scaling_factor
    if method is None:
        return ""
    # no L: a Hugging Face model whose config names none, and its scorer refuses any extension
    factor_at = 1.0 if train_len is None else scaling_factor(method, factor, train_len, eval_len)
    try:
        scorer.set_scaling(method, factor_at, train_len)
    except ValueError as e:
        raise UserError(str(e)) from None
    return scaling_label(method, factor)


def evaluate_run(run_dir, eval_cfg, results_root="results", device="auto", progress: bool = True,
                 skip_done: bool | None = None, position_cfg=None, precision: str = "auto",
                 extension_cfg=None, allow_failed: bool = False) -> list[dict]:
    """Evaluation(...).run() of a trained run: upsert its rows into results_root/<experiment>/extrapolation.csv,
    save its per-position losses, rebuild the report. eval_cfg is an EvalConfig or a dict of eval.* keys,
    position_cfg the RoPE extension (rope_scaling()); skip_done (default eval_cfg.skip_done) scores only lengths
    not yet in the CSV, so that an interrupted sweep started again does only what is missing."""
    if trained_task(Path(run_dir)) != "lm":  # a synthetic task: accuracy at L..16L (alibi_lm/eval/task_evaluation.py)
        refuse_scaling_of_task_run(position_cfg)
        if precision != "auto":
            raise UserError(f"precision={precision} applies to language-model runs; a synthetic task's run is scored "
                            f"in float32 (drop precision=)")
        return evaluate_task_run(run_dir, eval_cfg, results_root, resolve_device(str(device)), progress, skip_done,
                                 allow_failed, extension_cfg)
    subject = open_native(Path(run_dir), Path(results_root), resolve_device(str(device)), precision, allow_failed)
    evaluation = Evaluation(subject, eval_cfg, progress, skip_done, position_cfg, extension_cfg)  # checks the settings
    identity = {k: subject.identity[k] for k in ("position", "train_len", "seed")}
    record_learned(subject.scorer.model, subject.out_dir, identity, subject.provenance)  # before the report
    return evaluation.run()


def refuse_scaling_of_task_run(position_cfg) -> None:
    if position_cfg is not None and typed(RopeScalingConfig, position_cfg, "position").scaling is not None:
        raise UserError("position.scaling applies to language-model runs; drop it for a synthetic task's run")


def evaluation_pending(run_dir, eval_cfg, results_root="results", device="auto", position_cfg=None,
                       extension_cfg=None) -> bool:
    """Whether evaluate_run(..., skip_done=True) would score or write anything for this run, asked in-process by a
    plan driver that must not start a process per finished run: the same checks and refusals. The model is read
    to the CPU whatever the device (weights_digest hashes CPU bytes), so that the long-lived driver holds no GPU."""
    resolve_device(str(device))  # a device that is not there is refused, as evaluate_run does
    if trained_task(Path(run_dir)) != "lm":
        refuse_scaling_of_task_run(position_cfg)
        cpu = torch.device("cpu")
        return TaskEvaluation(Path(run_dir), eval_cfg, results_root, cpu, progress=False, skip_done=True,
                              extension_cfg=extension_cfg).pending()
    subject = open_native(Path(run_dir), Path(results_root), torch.device("cpu"))
    identity = {k: subject.identity[k] for k in ("position", "train_len", "seed")}
    evaluation = Evaluation(subject, eval_cfg, progress=False, skip_done=True, position_cfg=position_cfg,
                            extension_cfg=extension_cfg)
    return evaluation.pending() or not learned_recorded(subject.scorer.model, subject.out_dir, identity,
                                                        subject.provenance)


def trained_task(run_dir: Path) -> str:
    """The task a run folder was trained on: its config.yaml's task_name (lm for runs made before tasks existed). A
    folder without config.yaml is left to the language-model path, whose load_run names what is missing."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return "lm"
    try:
        return str(OmegaConf.load(path).get("task_name", "lm"))
    except (OSError, ValueError, OmegaConfBaseException, yaml.YAMLError) as e:
        raise UserError(f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                        f"restore it from the run's checkpoint or train the run again") from None
