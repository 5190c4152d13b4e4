"""Scoring the comparison's runs: perplexity and key-token perplexity at L..16L with no method and each method a
base run's scheme takes (a fine-tune or a reference: no method on top, a column of its own) into
results/extension/extrapolation.csv; the passkey probe of the base runs into passkey.csv; the attention mass on the
first tokens (sinks.csv). skip_done everywhere: a killed sweep resumes; rows a working tree with uncommitted changes
scored are scored again (dirty_labels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ...config import EvalConfig
from ...errors import ConfigError
from ...eval.evaluation import evaluate_run
from ...eval.sinks import first_token_mass
from ...extension import OPTIONS, build_extension
from ...probes import app as probes_app
from ...probes.config import PasskeyConfig, ProbesJob
from ...provenance import command_line, weights_digest
from ...results import store
from ...subjects import open_native
from ...subjects.native import FINETUNE_JSON, load_run
from .runs import BASE_L, DIRTY, MULTIPLIERS, methods_for, scheme_of_run, train_len_of

SINK_TOKENS = 4
# the passkey grid of the comparison: the probe's defaults (5 digits, the paper's filler) on fewer depths and trials
PASSKEY = dict(multipliers=MULTIPLIERS, depths=[0.0, 0.5, 1.0], trials=5)
PASSKEY_TOKENS_PER_BATCH = 8192


def eval_config(run: Path, base: int, max_tokens: int) -> EvalConfig:
    """L..16L of the base L; a reference trained from scratch at s L is scored at the same lengths."""
    lengths = dict(multipliers=[], lengths=[m * base for m in MULTIPLIERS]) if train_len_of(run) != base else \
        dict(multipliers=MULTIPLIERS)
    return EvalConfig(**lengths, max_tokens=max_tokens, longppl=True, skip_done=True, tokens_per_batch=8192)


def is_base(run: Path, base: int = BASE_L) -> bool:
    return train_len_of(run) == base and not (run / FINETUNE_JSON).is_file()


def methods_of_run(run: Path, base: int) -> list[str | None]:
    """None (no method) and each method the run's scheme takes; a fine-tune or a reference: no method on top."""
    return [None, *(methods_for(scheme_of_run(run)) if is_base(run, base) else [])]


def label_of(method: str | None, base: int = BASE_L) -> str:
    """The rows' rope_scaling value of a method ('' for none)."""
    return "" if method is None else build_extension(method, {}, base).label()


def weights_of(run: Path) -> str:
    """The digest of a run's weights, which its rows carry (provenance.weights_digest)."""
    return weights_digest(load_run(run)[0])


def method_labels(csv: Path, weights: str, read=store.read_results, dirty_only: bool = False) -> set[str]:
    """The method labels ('' none) with rows in csv from these weights (a table without a rope_scaling column holds
    the plain model's alone); dirty_only: those whose rows were scored from a working tree with uncommitted changes."""
    df = read(csv)
    if df.empty or "weights" not in df:
        return set()
    mine = df[df["weights"].map(store.key_text) == weights]
    if dirty_only:
        mine = mine[mine["commit"].astype(str).str.contains(DIRTY)]
    if "rope_scaling" not in mine:
        return {""} if len(mine) else set()
    return set(mine["rope_scaling"].map(store.key_text))


def dirty_labels(csv: Path, weights: str, read=store.read_results) -> set[str]:
    """The method labels whose rows from these weights come from a dirty tree: scored again (a retrained run with
    bit-identical weights would otherwise keep them)."""
    return method_labels(csv, weights, read, dirty_only=True)


def evaluate(run: Path, base: int, results: Path, max_tokens: int) -> None:
    """Perplexity rows of one run with every method (skip_done: what is there from these weights is kept, unless a
    working tree with uncommitted changes scored it)."""
    dirty = dirty_labels(results / "extension" / store.CSV_NAME, weights_of(run))
    for method in methods_of_run(run, base):
        label = label_of(method, base)
        print(f"== {run.name} {method or 'no method'}" + (" (again: its rows are from a dirty tree)" if label in dirty
                                                          else ""), flush=True)
        evaluate_run(run, eval_config(run, base, max_tokens), results, device="cpu", progress=False,
                     skip_done=label not in dirty, extension_cfg=None if method is None else OPTIONS[method]())


def passkey(run: Path, base: int, results: Path) -> None:
    """Passkey rows of one base run with every method into results/extension/passkey.csv (the probes app's
    run_passkey: skip_done by weights, data, trials and texts)."""
    if not is_base(run, base):
        return
    for method in methods_of_run(run, base):
        subject = open_native(run, results, torch.device("cpu"))  # a fresh model: no method left from the last one
        extra = dict(subject.provenance, data_sha=subject.split_sha("valid"), command=command_line())
        options = None if method is None else OPTIONS[method]()
        job = ProbesJob(run=str(run), probe="passkey", passkey=PasskeyConfig(**PASSKEY),
                        tokens_per_batch=PASSKEY_TOKENS_PER_BATCH, extension=options)
        print(f"== {run.name} passkey {method or 'no method'}", flush=True)
        probes_app.run_passkey(subject, job, extra, probes_app.extended(subject, options))


def sink_rows(runs: list[Path], results: Path, max_tokens: int) -> pd.DataFrame:
    """Attention mass on the first SINK_TOKENS tokens, per layer and head, at L and 16L, without a method and with
    streaming's sinks."""
    rows = []
    for run in runs:
        subject = open_native(run, results, torch.device("cpu"))
        model, L = subject.scorer.model, subject.identity["train_len"]
        tokens = subject.tokens("valid")[: max_tokens + 1]
        for method in (None, "streaming"):
            if method is not None:
                try:
                    model.set_extension(build_extension(method, {}, L))
                except ConfigError:
                    continue
            for lv in (L, 16 * L):
                mass = first_token_mass(model, tokens, lv, SINK_TOKENS, windows=2)
                rows += [dict(position=subject.identity["position"], seed=subject.identity["seed"], train_len=L,
                              eval_len=lv, extension=method or "none", layer=layer, head=head, mass=float(m))
                         for (layer, head), m in np.ndenumerate(mass)]
        model.set_extension(None)
    return pd.DataFrame(rows)
