"""A run trained on a synthetic task, scored at lengths Lv = L..16L: rows into results/<experiment>/tasks.csv.

Each (length, variant) cell is scored by task_scoring.score_cell (token_acc, exact, greedy where the task has it,
loss), with the chance levels beside it (chance_token / chance_exact: uniform guessing among the answer's values).
Every cell, the passkey's depth grid included, scores eval.examples sequences (the suite: 1,024; not given: the run's
own, from its config.yaml, so that scoring a run again by hand draws the sequences of its rows). A run trained with
randomized positions is scored with randomized positions too (from [0, M), seeded per batch), as Ruoss et al.
evaluate; the positions column says which. A run that kept its weights every train.keep_checkpoints_every steps
has each kept checkpoint scored at L, 4L and 16L on the same sequences (teacher forcing), in over_training.csv:
accuracy past L against training steps.
"""

from __future__ import annotations

import dataclasses
import math
import time
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from ..checkpoint import check_usable_run
from ..config import DEFAULT_TASK_EXAMPLES, EvalConfig, RopeScalingConfig, typed
from ..costs import FirstBatchEstimate
from ..errors import UserError
from ..model import TransformerLM, position_label
from ..positions import PositionRangeError
from ..provenance import command_line, device_name, git_commit, model_digest, repo_relative, weights_digest
from ..results.learned_values import learned_recorded, record_learned
from ..results.retrieval_store import RETRIEVAL_CSV, measured_lengths, read_retrieval, write_rows
from ..results.store import check_no_other_weights, drop_rows, key_text, other_model_error
from ..results.task_report import build_task_report
from ..results.task_store import (
    KEY,
    OVER_TRAINING_CSV,
    TASKS_CSV,
    cell_draws,
    options_label,
    read_over_training,
    read_task_results,
    upsert_over_training,
    upsert_rows,
)
from ..subjects import NOT_APPLICABLE, load_run
from ..subjects.native import ALLOW_FAILED, NativeScorer, checkpoint_model, read_finetune_record, set_trained_scaling
from ..tasks import build_task
from ..tasks.base import Task
from ..tasks.stream import PositionPolicy, kept_steps
from .extension import apply_method, chosen_method
from .retrieval import head_slopes, measure, rows_of, sequences_at
from .scoring import eval_lengths
from .task_scoring import answered_sequences, score_cell, sequences_per_batch

RETRIEVAL_SHARE = 4  # retrieval.csv measures attention on eval.examples // RETRIEVAL_SHARE sequences per length
OVER_TRAINING_MULTIPLES = (1, 4, 16)  # the lengths (x L) at which each kept checkpoint is scored


def perplexity_only_keys(ev: EvalConfig) -> list[str]:
    """The eval.* settings a task run was given that only perplexity evaluation reads (windows over a text split)."""
    return [f"eval.{key}={value}" for key, value, default in (("mode", ev.mode, "nonoverlapping"), ("stride", ev.stride, None),
                                                            ("max_tokens", ev.max_tokens, None), ("longppl", ev.longppl, False))
            if value != default]


class TaskEvaluation:
    """One run of a synthetic task scored at every eval length and variant (the passkey's depth grid), each
    cell's row added to tasks.csv as soon as it is scored (a kill loses at most that cell)."""

    def __init__(self, run_dir: Path, eval_cfg, results_root, device, progress=True, skip_done=None,
                 allow_failed: bool = False, extension_cfg=None, csv: Path | None = None):
        self.ev = typed(EvalConfig, eval_cfg, "eval")
        if self.ev.attention != "full" or self.ev.temperature_tuning:
            raise UserError("eval.attention and eval.temperature_tuning change perplexity evaluation only; a synthetic "
                            "task is scored with the attention it was trained with: drop them")
        if set_keys := perplexity_only_keys(self.ev):
            raise UserError(f"{', '.join(set_keys)} set how perplexity is measured on a text split; a synthetic task "
                            f"scores eval.examples fixed test sequences of its own per length: drop them")
        self.skip_done = self.ev.skip_done if skip_done is None else skip_done
        self.model, cfg, state = load_run(run_dir, device, allow_failed)
        self.note = check_usable_run(run_dir, state, ALLOW_FAILED, allowed=True)  # "": a run fit to be scored
        self.run_dir = Path(run_dir)
        self.device, self.progress = device, progress
        self.task = build_task(str(cfg.task_name), OmegaConf.to_container(cfg.task, resolve=True))
        tc = cfg.train
        self.L, self.policy = int(tc.seq_len), PositionPolicy(str(tc.positions), tc.max_position)
        self.keep_every = int(OmegaConf.select(tc, "keep_checkpoints_every") or 0)  # 0: kept no weights
        self.own_eval = OmegaConf.select(cfg, "eval") or {}  # the settings its own evaluation (evaluate_after) used
        # eval.examples not given: the run's own, so that a run scored again by hand draws the sequences of its rows
        self.ev = dataclasses.replace(self.ev, examples=self.ev.examples or self.own_eval.get("examples")
                                      or DEFAULT_TASK_EXAMPLES)
        # csv: another table's rows (the extension comparison's); by default the run's experiment's
        self.csv = Path(csv) if csv is not None else Path(results_root) / str(cfg.name) / TASKS_CSV
        self.identity = dict(task=self.task.name, task_options=options_label(self.task.options),
                             position=position_label(state["model_config"]), positions=self.policy.label,
                             train_len=self.L, seed=int(cfg.seed))
        self.provenance = dict(run=repo_relative(run_dir), step=state.get("step"), weights=weights_digest(self.model),
                               model=model_digest(state["model_config"]), commit=git_commit(), device=device_name(device))
        self.method, self.scaling = self.extension(extension_cfg)

    def extension(self, extension_cfg):
        """(the extension= method or None, its rows' label): refused in one line, before any work, where it does not
        fit the scheme (eval/extension.py) or the run's randomized positions (the methods take sequential ones)."""
        method = chosen_method(RopeScalingConfig(), extension_cfg, self.L)
        if method is not None and self.policy.kind == "random":
            raise UserError(f"extension={method.name} remaps sequential positions; this run was trained and is scored "
                            f"with train.positions=random: drop extension")
        return method, apply_method(NativeScorer(self.model), method, self.L)

    def cells(self) -> list[tuple[str, Task, int]]:
        lengths = eval_lengths(self.L, self.ev.multipliers, self.ev.lengths)
        if self.policy.kind == "random" and max(lengths) > self.policy.max_position:
            raise UserError(f"eval length {max(lengths)} exceeds train.max_position={self.policy.max_position}, the range "
                            f"this run's randomized positions come from; evaluate at most {self.policy.max_position}")
        if min(lengths) < self.task.min_length:
            raise UserError(f"eval length {min(lengths)} is too short: task {self.task.name} needs sequences of at least "
                            f"{self.task.min_length} positions; set eval.lengths and eval.multipliers to lengths >= "
                            f"{self.task.min_length}")
        variants = [("", self.task)] + [(label, type(self.task)(**changes)) for label, changes in self.task.variants()]
        cells = [(label, task, lv) for label, task in variants for lv in lengths]
        if self.skip_done:  # scored from these weights, on the sequences these settings score (or not applicable)
            done = cell_draws(self.csv, self.provenance["weights"])
            cells = [(label, task, lv) for label, task, lv in cells
                     if not self.same_sequences(*done.get(self.key_text(label, lv), (-1.0, math.nan)), task, lv)]
        return cells

    def key_text(self, variant: str, eval_len: int) -> tuple:
        return tuple(key_text(self.key(variant, eval_len)[k]) for k in KEY)

    def same_sequences(self, count: float, batch: float, task: Task, length: int) -> bool:
        """Whether a row's `examples` (NaN: a row that says not applicable) and `batch_sequences` (NaN: not recorded,
        in older rows) are what these eval settings score: as many sequences with answers, drawn in the same batches."""
        same_batches = math.isnan(batch) or int(batch) == sequences_per_batch(length, self.ev)
        return math.isnan(count) or (int(count) == answered_sequences(task, length, self.ev) and same_batches)

    def check_same_sequences(self, cells) -> None:
        """One line, before anything is scored, where results/ holds a cell of this run (from any weights) or an
        over-training row scored on another number of test sequences with answers (another eval.examples; another
        eval.tokens_per_batch, which draws other sequences in other batches): the key does not tell them apart, and
        mixing them would make the cell's interval and the scheme comparison wrong."""
        draws = cell_draws(self.csv)
        for label, task, lv in cells:
            count, batch = draws.get(self.key_text(label, lv), (math.nan, math.nan))
            if not self.same_sequences(count, batch, task, lv):
                raise UserError(self.other_sequences_error(f"the cell Lv={lv}{f' ({label})' if label else ''}", count,
                                                           batch, task, lv))
        scores_kept = self.method is None and self.own_kept_steps()  # score_kept() would write over_training.csv
        for row in self.own_over_training_rows().itertuples() if scores_kept else ():
            if not self.same_sequences(float(row.examples), float(row.batch_sequences), self.task, int(row.eval_len)):
                raise UserError(self.other_sequences_error(f"the kept step {row.step} at Lv={row.eval_len}", row.examples,
                                                           row.batch_sequences, self.task, int(row.eval_len)))

    def other_sequences_error(self, what: str, count, batch, task: Task, length: int) -> str:
        def draw(n, size) -> str:
            return f"{int(n):,} sequences with answers" + ("" if math.isnan(float(size)) else f" in batches of {int(size)}")

        wanted = draw(answered_sequences(task, length, self.ev), sequences_per_batch(length, self.ev))
        return (f"{self.csv.parent} holds {what} of {self.provenance['run']} scored on {draw(count, batch)}; this "
                f"evaluation scores {wanted} (eval.examples={self.ev.examples}, eval.tokens_per_batch="
                f"{self.ev.tokens_per_batch}: which sequences a cell draws) and would mix them: use the settings the "
                f"run was scored with ({self.own_settings()}), or write elsewhere with paths.results=<folder>")

    def own_settings(self) -> str:
        """The settings that draw a cell's sequences as the run's own evaluation did (its config.yaml's eval.*,
        as the suite's evaluate_after scored them), as overrides: `eval.examples=1024`."""
        own = {key: self.own_eval.get(key) for key in ("examples", "tokens_per_batch")}
        changed = [f"eval.{k}={v}" for k, v in own.items() if v is not None and v != getattr(self.ev, k)]
        return " ".join(changed) if changed else "its config.yaml's eval.*"

    def key(self, variant: str, eval_len: int) -> dict:
        return dict(self.identity, eval_len=eval_len, variant=variant, rope_scaling=self.scaling)

    def run(self) -> list[dict]:
        cells = self.cells()  # checks the lengths first
        self.drop_other_trainings()  # refuses another model's rows first
        self.check_same_sequences(cells)  # on the rows that are this training's
        learned = record_learned(self.model, self.csv.parent, self.identity, self.provenance)  # for the report
        if not cells:
            print(f"{self.provenance['run']}: every cell is already in {self.csv}, from these weights; skipping")
            if self.retrieve() | self.score_kept() or learned:
                self.report([])
            return []
        lengths = sorted({lv for _, _, lv in cells})
        tokens = sum(self.ev.examples * lv for _, _, lv in cells)
        print(f"{self.provenance['run']}: {len(cells)} cells x {self.ev.examples} sequences "
              f"({', '.join(f'Lv={lv}' for lv in lengths)}): {tokens:,} tokens through the model; time: printed "
              f"after the first batch")
        bar = tqdm(total=tokens, unit="tok", unit_scale=True, disable=not self.progress,
                   desc=f"{self.task.name} {self.identity['position']}", dynamic_ncols=True)
        caveat = f" (at Lv = {cells[0][2]}; longer sequences cost more per token)" if len(lengths) > 1 else ""
        estimate = FirstBatchEstimate(bar, "tokens through the model", caveat)  # a huge Lv is seen before it runs
        rows = [self.score(variant, task, length, estimate) for variant, task, length in cells]
        bar.close()
        self.retrieve()
        self.score_kept()
        self.report(rows)
        return rows

    def score(self, variant: str, task: Task, length: int, bar: FirstBatchEstimate, greedy: bool = True) -> dict:
        """One cell's row, upserted into self.csv at once; greedy decoding (the task as trained) unless greedy=False."""
        t0 = time.perf_counter()
        note = ""
        apply_method(NativeScorer(self.model), self.method, length)  # a group or factor that follows Lv
        try:
            metrics = score_cell(self.model, task, self.policy, length, self.ev, self.device, bar,
                                 greedy=greedy and not variant)
        except NOT_APPLICABLE as e:  # a learned table shorter than Lv: a row that says so, as perplexity's
            metrics, note = {}, f"not applicable: {str(e).splitlines()[0][:160]}"
            bar.skip(self.ev.examples * length)  # no batch ran: not the estimate's rate
        chance_token, chance_exact = task.chance(length)
        note = "; ".join(filter(None, (self.note, note)))  # a failed run scored on purpose says so
        row = dict(self.key(variant, length), **metrics, batch_sequences=sequences_per_batch(length, self.ev), note=note,
                   chance_token=chance_token, chance_exact=chance_exact, **self.provenance,
                   wall_s=round(time.perf_counter() - t0, 3),
                   timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=command_line())
        upsert_rows(self.csv, [row])
        return row

    def pending(self) -> bool:
        """Whether run() would score or write anything: a cell, a retrieval length, a kept step or the learned values
        not yet in the results from these weights and on as many test sequences as these settings score (with
        skip_done; without it, everything is scored again)."""
        measurable = [lv for lv in self.retrieval_lengths() if self.takes_positions_of(lv)]
        return bool(self.cells() or measurable or self.kept_pending()) or not learned_recorded(
            self.model, self.csv.parent, self.identity, self.provenance)

    def kept_pending(self) -> list[tuple[int, Path]]:
        """The kept checkpoints (train.keep_checkpoints_every) with a length of OVER_TRAINING_MULTIPLES not yet in
        over_training.csv from their own weights (skip_done): rows of an earlier training of this run (stopped
        part-way, or on another machine), whose weights differ, are scored again, never taken for this one's."""
        kept = [] if self.method is not None else self.own_kept_steps()  # the plain model's measure only
        if not kept or not self.skip_done:
            return kept
        mine = self.own_over_training_rows()
        wanted = set(self.over_training_lengths())

        def scored(step: int, path: Path) -> bool:
            same = pd.Series([self.same_sequences(float(n), float(size), self.task, int(lv))
                              for n, size, lv in zip(mine["examples"], mine["batch_sequences"], mine["eval_len"])],
                             index=mine.index, dtype=bool)
            rows = mine[(mine["step"] == step) & same]
            if not wanted <= set(rows["eval_len"].astype(int)):
                return False
            digest = weights_digest(self.kept_model(path))
            return set(rows.loc[rows["eval_len"].astype(int).isin(wanted), "weights"].astype(str)) == {digest}

        return [(step, path) for step, path in kept if not scored(step, path)]

    def drop_other_trainings(self) -> None:
        """This run's rows (its folder and seed) from an earlier training of it (its folder deleted and trained again,
        or trained on another machine; another budget, keep interval or set of lengths), which the new rows would not
        all replace, removed before scoring so that no table holds two trainings of a run: in tasks.csv and
        retrieval.csv those from other weights; in over_training.csv those at a step whose kept weights here differ,
        past this run's last step, or off its keep interval (a step whose kept file is gone, pruned by hand, keeps
        its rows: nothing here can score them again). Rows of another model under this run's folder are refused in
        one line instead, as replacing them would be (results.store.check_same_model)."""
        if self.method is not None:  # an extension's rows go elsewhere; the plain model's evaluation owns these
            return
        self.check_same_model_rows()
        if self.note:  # scored on purpose though it did not finish (allow_failed_run)
            self.check_no_finished_rows()
        mine, weights = self.own_rows, self.provenance["weights"]
        kept = {step: weights_digest(self.kept_model(path)) for step, path in self.own_kept_steps()}
        last, every = int(self.provenance["step"] or 0), self.keep_every

        def other_weights(df):
            return mine(df) & (df["weights"].map(key_text) != key_text(weights))

        def other_kept(df):
            step = df["step"].astype(int)
            here = step.map(kept)  # the digest of the kept file at that step; NaN where there is none
            off = step % every != 0 if every else pd.Series(True, index=df.index)
            return mine(df) & ((here.notna() & (df["weights"].map(key_text) != here)) | (step > last) | off)

        dropped = {table: drop_rows(self.csv.parent / table, read, drop) for table, read, drop in (
            (TASKS_CSV, read_task_results, other_weights), (RETRIEVAL_CSV, read_retrieval, other_weights),
            (OVER_TRAINING_CSV, read_over_training, other_kept))}
        if any(dropped.values()):
            print(f"{self.provenance['run']}: removed the rows of an earlier training of this run: "
                  + ", ".join(f"{n} in {table}" for table, n in dropped.items() if n))

    def own_kept_steps(self) -> list[tuple[int, Path]]:
        """The kept checkpoints of this training: on its keep interval and up to its last step (a file past it, left
        by a withdrawn checkpoint, is not scored, as drop_other_trainings would drop its rows again)."""
        last, every = int(self.provenance["step"] or 0), self.keep_every
        return [(step, path) for step, path in kept_steps(self.run_dir)
                if step <= last and (not every or step % every == 0)]

    def check_same_model_rows(self) -> None:
        """One line where tasks.csv, over_training.csv or retrieval.csv holds rows of another model under this run's
        folder and seed (a run of other settings trained into the suite's folder): they are not an earlier training
        of this run, and are kept. Rows written before the model was recorded name none and pass."""
        for path, read in ((self.csv, read_task_results), (self.csv.parent / OVER_TRAINING_CSV, read_over_training),
                           (self.csv.parent / RETRIEVAL_CSV, read_retrieval)):
            df = read(path)
            other = set(df[self.own_rows(df)]["model"].map(key_text)) - {"", key_text(self.provenance["model"])}
            if other:
                raise other_model_error(path, other, self.provenance["model"], self.provenance["run"])

    def check_no_finished_rows(self) -> None:
        """A run that did not finish, scored on purpose, never stands in for another training of it: where tasks.csv
        holds this run's rows from other weights (a finished training's, as a suite commits them), one line refuses
        instead of replacing them."""
        df = read_task_results(self.csv)
        check_no_other_weights(self.csv, df[self.own_rows(df)]["weights"], self.provenance, self.note)

    def own_rows(self, df: pd.DataFrame) -> pd.Series:
        """(rows,) bool: a table's rows of this run (its folder and seed), from any weights."""
        return (df["run"].astype(str) == self.provenance["run"]) & (df["seed"].astype(str) == str(self.identity["seed"]))

    def own_over_training_rows(self) -> pd.DataFrame:
        """over_training.csv's rows of this run, from any weights."""
        df = read_over_training(self.csv.parent / OVER_TRAINING_CSV)
        return df[self.own_rows(df)]

    def kept_model(self, path: Path) -> TransformerLM:
        """The model of a kept checkpoint, on the CPU, in eval mode, built and rescaled as load_run builds its run's."""
        model = checkpoint_model(torch.load(path, map_location="cpu", weights_only=True))
        set_trained_scaling(model, read_finetune_record(self.run_dir))  # a fine-tune's rescaling, as load_run sets it
        return model.eval()

    def score_kept(self) -> bool:
        """over_training.csv: each pending kept checkpoint's exact match and answer-token accuracy at L, 4L and 16L on
        eval.examples test sequences (teacher forcing; the same sequences as tasks.csv; the last step's, the run's own
        weights, taken from its cells); whether it wrote rows."""
        pending, final = self.kept_pending(), self.cells_of_these_weights()
        for step, path in pending:
            model = self.kept_model(path).to(self.device)
            provenance = dict(self.provenance, weights=weights_digest(model))
            for length in self.over_training_lengths():
                t0 = time.perf_counter()
                if provenance["weights"] == self.provenance["weights"] and length in final:
                    metrics = final[length]  # the last kept step is the run's own weights: its cell, not scored twice
                else:
                    with tqdm(total=self.ev.examples, disable=True) as bar:
                        metrics = score_cell(model, self.task, self.policy, length, self.ev, self.device, bar,
                                             greedy=False)
                upsert_over_training(self.csv.parent / OVER_TRAINING_CSV, [dict(
                    self.identity, step=step, eval_len=length, token_acc=metrics["token_acc"], exact=metrics["exact"],
                    examples=metrics["examples"], batch_sequences=sequences_per_batch(length, self.ev),
                    **{k: provenance[k] for k in ("run", "weights", "model", "commit", "device")},
                    wall_s=round(time.perf_counter() - t0, 3),
                    timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"), command=command_line())])
        return bool(pending)

    def cells_of_these_weights(self) -> dict[int, dict]:
        """tasks.csv's cells of the task as trained, scored from the run's own weights on the sequences these settings
        score, by Lv: teacher forcing on the same batches, so a kept checkpoint of these weights (the last step's)
        would score the same numbers again."""
        df = read_task_results(self.csv)
        mine = df[self.own_rows(df) & (df["variant"] == "") & (df["rope_scaling"] == self.scaling)
                  & (df["weights"].map(key_text) == key_text(self.provenance["weights"]))].dropna(subset=["exact"])
        return {int(r.eval_len): dict(token_acc=float(r.token_acc), exact=float(r.exact), examples=int(r.examples))
                for r in mine.itertuples()
                if self.same_sequences(float(r.examples), float(r.batch_sequences), self.task, int(r.eval_len))}

    def over_training_lengths(self) -> list[int]:
        """The lengths of OVER_TRAINING_MULTIPLES that score_kept() measures: those the model takes the positions of
        (a learned table of L positions is measured at L only; tasks.csv says not applicable past it)."""
        return [m * self.L for m in OVER_TRAINING_MULTIPLES if self.takes_positions_of(m * self.L)]

    def takes_positions_of(self, length: int) -> bool:
        """Whether every scheme of the model takes the positions a sequence of `length` is given: retrieve()
        measures no other length (a learned table shorter than Lv; its tasks.csv row says not applicable)."""
        end = length if self.policy.kind == "sequential" else self.policy.max_position
        try:
            for scheme in self.model.schemes().values():
                scheme.check_positions(end)
        except PositionRangeError:
            return False
        return True

    def retrieval_lengths(self) -> list[int]:
        """The eval lengths retrieve() measures: all, less those in retrieval.csv from these weights (skip_done);
        none for a task whose answers copy no single token."""
        if type(self.task).sources is Task.sources or self.method is not None:  # the plain model's measure only
            return []
        path, weights = self.csv.parent / RETRIEVAL_CSV, self.provenance["weights"]
        lengths = eval_lengths(self.L, self.ev.multipliers, self.ev.lengths)
        done = measured_lengths(path, self.identity, weights) if self.skip_done else set()
        return [lv for lv in lengths if key_text(lv) not in done]

    def retrieve(self) -> bool:
        """retrieval.csv: each head's attention on the copied token by distance (retrieval.py), at every eval length
        not yet there from these weights, on eval.examples // RETRIEVAL_SHARE sequences; whether it wrote rows."""
        path, wrote = self.csv.parent / RETRIEVAL_CSV, False
        slopes, examples = head_slopes(self.model), max(1, self.ev.examples // RETRIEVAL_SHARE)  # up to 4L
        for length in self.retrieval_lengths():
            t0 = time.perf_counter()
            try:
                sums = measure(self.model, self.task, self.policy, length, sequences_at(examples, self.L, length),
                               self.device)
            except PositionRangeError:  # a learned table shorter than Lv: its tasks.csv row says so
                continue
            write_rows(path, rows_of(sums, dict(self.identity, eval_len=length), slopes, self.provenance,
                                     round(time.perf_counter() - t0, 3), command_line()))
            wrote = True
        return wrote

    def report(self, rows: list[dict]) -> None:
        build_task_report(self.csv.parent)
        if self.progress:
            main = pd.DataFrame([r for r in rows if not r["variant"]])
            if not main.empty:
                columns = [c for c in ("eval_len", "token_acc", "exact", "greedy", "chance_token", "wall_s") if c in main]
                print(f"\n{self.provenance['run']} ({self.task.name}, {self.identity['position']}, "
                      f"positions {self.policy.label}, L={self.L}):")
                print(main[columns].to_string(index=False, float_format=lambda v: f"{v:.3f}"))
            print(f"-> {self.csv}, {self.csv.parent / 'tasks.md'}")


def evaluate_task_run(run_dir, eval_cfg, results_root="results", device=None, progress=True, skip_done=None,
                      allow_failed: bool = False, extension_cfg=None):
    return TaskEvaluation(Path(run_dir), eval_cfg, results_root, device, progress, skip_done, allow_failed,
                          extension_cfg).run()


__all__ = ["TaskEvaluation", "evaluate_task_run"]
