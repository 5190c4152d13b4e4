"""The probes app (configs/probes.yaml): passkey retrieval and the context-use curve for one model or
every run of an experiment, then the report.

    python -m alibi_lm.probes run=runs/quick/alibi-L64-seed0
    python -m alibi_lm.probes sweep=quick                        # make context-probes EXPERIMENT=quick
    python -m alibi_lm.probes run=hf:path/to/model data=wikitext2 hf.train_len=1024 probe=passkey
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from .. import cli, hf
from ..errors import UserError
from . import context_use, passkey, report
from .subject import Subject, command_line, open_hf, open_native, sweep_runs

PROBES = ("passkey", "context", "all")


def _targets(cfg: DictConfig) -> list:
    from ..checkpoint import latest_run

    if cfg.sweep:
        return sweep_runs(Path(cfg.paths.runs), str(cfg.sweep))
    return [cfg.run] if cfg.run else [latest_run(Path(cfg.paths.runs))]


def _print_passkey(subject: Subject, rows: list[dict]) -> None:
    scored = [r for r in rows if "acc" in r]
    if scored:
        acc, gain, copy = (sum(r[k] for r in scored) / len(scored) for k in ("acc", "gain", "copy_gain"))
        print(f"  passkey Lv={rows[0]['eval_len']}: accuracy {acc:.3f}, gain {gain:+.3f} nats/token over no key, "
              f"{copy:+.3f} over another key (mean over {len(scored)} depths)")
    else:
        print(f"  passkey Lv={rows[0]['eval_len']}: {rows[0]['note']}")


def run_passkey(subject: Subject, cfg: DictConfig, extra: dict) -> None:
    csv = subject.out_dir / report.PASSKEY_CSV
    done = report.passkey_done(csv) if cfg.skip_done else None

    def save(rows):
        report.replace_rows(csv, [dict(r, **extra) for r in rows], report.PASSKEY_KEY)
        _print_passkey(subject, rows)

    if not passkey.probe(subject, cfg.passkey, cfg.split, int(cfg.tokens_per_batch), done, save):
        print(f"  passkey: every cell is already in {csv}")


def run_context(subject: Subject, cfg: DictConfig, extra: dict) -> None:
    csv = subject.out_dir / report.CONTEXT_CSV
    if cfg.skip_done and report.context_done(csv, subject.identity, cfg.split):
        print(f"  context use: already in {csv}")
        return
    rows = context_use.probe(subject, cfg.context, cfg.split, int(cfg.tokens_per_batch))
    report.replace_rows(csv, [dict(r, **extra) for r in rows], report.MODEL_KEY)
    if "loss" in rows[0]:
        import pandas as pd

        s = context_use.summary(pd.DataFrame(rows), subject.identity["train_len"], float(cfg.context.eps),
                                float(cfg.context.z))
        print(f"  context use up to {rows[0]['eval_len']}: c* = {s['c_star']:.0f} (L = {subject.identity['train_len']}), "
              f"gain beyond L {s['gain_beyond_L']:+.3f} ± {s['gain_beyond_L_se']:.3f} nats ({rows[0]['wall_s']:.0f} s)")
    else:
        print(f"  context use: {rows[0]['note']}")


def task(cfg: DictConfig) -> None:
    from ..evaluate import resolve_device

    device = resolve_device(cfg.device)
    out_dirs = []
    for target in _targets(cfg):
        if hf.is_hf(target):
            subject = open_hf(cfg, device)
        else:
            subject = open_native(Path(target), Path(cfg.paths.results), device)
            if not subject.completed:
                if cfg.sweep:
                    print(f"{target}: not a completed run; skipped (probe it with run={target})")
                    continue
                print(f"note: {target} is not a completed run")
        print(f"{subject.name} ({subject.provenance['run']}):")
        extra = dict(subject.provenance, command=command_line())
        if cfg.probe in ("passkey", "all"):
            run_passkey(subject, cfg, extra)
        if cfg.probe in ("context", "all"):
            run_context(subject, cfg, extra)
        if subject.out_dir not in out_dirs:
            out_dirs.append(subject.out_dir)
        report.build(subject.out_dir)  # after every model: a killed sweep leaves a report of what it did
    for out_dir in out_dirs:
        print(f"-> {out_dir / report.REPORT}")


def _number(value, key: str, low, integer: bool = False, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or value < low:
        kind = "an integer" if integer else "a number"
        raise UserError(f"{key} must be {kind} >= {low}{' or null' if allow_none else ''}, got {value!r}")


def validate(cfg: DictConfig) -> None:
    """Preflight: every setting, the model (run folder, hf: folder or sweep) and the results folder."""
    from ..checkpoint import CHECKPOINT
    from ..config import check_writable
    from ..evaluate import check_run_dir, resolve_device

    resolve_device(cfg.device)
    if cfg.probe not in PROBES:
        raise UserError(f"probe must be one of {', '.join(PROBES)}, got {cfg.probe!r}")
    if cfg.split not in ("valid", "test"):
        raise UserError(f"split must be valid or test, got {cfg.split!r}")
    _number(cfg.tokens_per_batch, "tokens_per_batch", 1, integer=True)
    pk, cx = cfg.passkey, cfg.context
    lengths = [*(pk.multipliers or []), *(pk.lengths or [])]
    if not lengths:
        raise UserError("no passkey lengths: set passkey.multipliers=[1,2,4,8,16] or passkey.lengths=[...]")
    for i, v in enumerate(lengths):
        _number(v, f"passkey.multipliers/lengths[{i}]", 1)
    if not pk.depths or any(isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 <= d <= 1 for d in pk.depths):
        raise UserError(f"passkey.depths must be numbers in [0, 1], got {list(pk.depths or [])}")
    _number(pk.trials, "passkey.trials", 1, integer=True)
    _number(pk.key_tokens, "passkey.key_tokens", 1, integer=True)
    _number(pk.seed, "passkey.seed", 0, integer=True)
    if pk.filler not in ("repeat", "valid"):
        raise UserError(f"passkey.filler must be repeat or valid, got {pk.filler!r}")
    if passkey.KEY_PLACEHOLDER not in str(pk.key_text):
        raise UserError(f"passkey.key_text must contain {passkey.KEY_PLACEHOLDER} where the key goes, got {pk.key_text!r}")
    _number(cx.multiplier, "context.multiplier", 1)
    _number(cx.stride, "context.stride", 1, integer=True, allow_none=True)
    _number(cx.max_tokens, "context.max_tokens", 1, integer=True, allow_none=True)
    _number(cx.bins_per_octave, "context.bins_per_octave", 1, integer=True)
    _number(cx.eps, "context.eps", 0)
    _number(cx.z, "context.z", 0)
    if cfg.run and cfg.sweep:
        raise UserError(f"set run= or sweep=, not both (got run={cfg.run}, sweep={cfg.sweep})")
    if hf.is_hf(cfg.run):
        hf.check(cfg)
    elif cfg.run:
        check_run_dir(Path(cfg.run))
    elif cfg.sweep and not any((Path(cfg.paths.runs) / str(cfg.sweep)).glob(f"**/{CHECKPOINT}")):
        raise UserError(f"sweep={cfg.sweep}: no run folder under {Path(cfg.paths.runs) / str(cfg.sweep)}; "
                        f"train the experiment first (make sweep EXPERIMENT={cfg.sweep}) or set paths.runs=...")
    check_writable(cfg.paths.results, "paths.results")


def main() -> None:
    cli.run("probes", task, validate=validate)
