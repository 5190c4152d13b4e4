"""Sections 1 and 2 (and the throughputs MFU is computed from): training steps of every scheme and
of the peers, all models of one L timed in the same paired rounds."""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from alibi_lm.model import LMConfig, TransformerLM
from alibi_lm.optim import build_optimizer

from .common import BASELINE, amp_context, attention_path, attention_why, describe_failure, lm_config, zipf_tokens
from .flops import flops_per_token
from .harness import run_rounds
from .options import Options
from .peers import NaiveALiBiLM, x_transformers_lm, x_transformers_loss
from .rows import PeerRatioRow, TrainRow
from .stats import Timings

PLAIN = "alibi-lm, plain softmax"  # the preset ALiBi model with model.adaptive_cutoffs=null
OUTPUT_ONLY = "output layer only"
PEERS = ("x-transformers", "naive")
COMPARISONS = {PLAIN: "like for like (plain softmax)", "alibi": "preset (adaptive softmax) vs peer (plain)"}
PEER_PAIRS = [(ours_name, peer) for ours_name in COMPARISONS for peer in PEERS]  # section 2's ratios, in table order


@dataclass
class Candidate:
    """One model of a training table: how it is labelled, and its step (None when it could not be built)."""

    name: str
    section: str  # train | peers | internal
    impl: str
    softmax: str
    backend: str | Callable[[], str]  # a callable is read after the rounds: a FlexAttention kernel may fall back
    lm: LMConfig | None
    step: Callable[[], None] | None = None
    baseline: str | None = None  # the model its throughput is compared with, paired by round
    note: str = ""
    why: Callable[[], str] | None = None  # why the attention is `backend`, read after the rounds like it


def train_step_fn(model, loss_of, x, y, cfg, device) -> Callable[[], None]:
    """One step as alibi_lm.train takes it: forward, backward, gradient clipping, optimizer step."""
    opt = build_optimizer(model, cfg.train)
    clip = cfg.train.grad_clip
    model.train()

    def step():
        with amp_context(device):
            loss = loss_of(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def ours(opts: Options, scheme: str, x, y, overrides=(), label=None, section="train", baseline=None):
    """(Candidate, model, cfg) of alibi-lm's model as `python -m alibi_lm.train` builds it; a scheme
    that cannot be built (no config, a constructor that raises) gives a Candidate with a note."""
    name, L = label or scheme, x.shape[1]
    try:
        lm, cfg = lm_config(opts.model, scheme, L, [*opts.overrides, *overrides])
        torch.manual_seed(0)
        with torch.device(opts.device):  # initialised where it runs: 227M weights take seconds to initialise on a CPU
            model = TransformerLM(lm)
    except Exception as e:  # noqa: BLE001  (reported in its cell)
        return Candidate(name, section, "alibi-lm", "", "", None, baseline=baseline, note=describe_failure(e)), None, None
    model.train()
    attention_why(model, opts.device)  # FlexAttention's gradient probe, before a compiled step traces the model
    compiled = torch.compile(model) if opts.compile else model
    step = train_step_fn(model, lambda a, b: compiled(a, targets=b).mean(), x, y, cfg, opts.device)
    softmax = "adaptive" if lm.adaptive_cutoffs else "plain"
    cand = Candidate(name, section, "alibi-lm", softmax, lambda: attention_path(model, opts.device), lm, step, baseline,
                     why=lambda: attention_why(model, opts.device))
    return cand, model, cfg


def scheme_candidates(opts: Options, x, y) -> list[Candidate]:
    """Section 1: every scheme against the baseline; on CUDA also without dropout (FlexAttention): the trade-off of
    the paper's presets, which train with attention dropout (SDPA) where FlexAttention has none."""
    out = [ours(opts, s, x, y, baseline=BASELINE if s != BASELINE else None)[0] for s in opts.schemes]
    if opts.cuda and opts.dropout_rows:  # without attention dropout, auto picks FlexAttention: show it too
        no_dropout, base0 = ["model.dropout=0", "model.attn_dropout=0"], f"{BASELINE} (dropout 0)"
        for s in [s for s in ("alibi", "t5", "kerple_log", "fire", "fox", BASELINE) if s in opts.schemes]:
            base = None if s == BASELINE else base0
            out.append(ours(opts, s, x, y, no_dropout, f"{s} (dropout 0)", baseline=base)[0])
    return out


def peer_candidates(opts: Options, x, y, log) -> list[Candidate]:
    """Section 2: the preset ALiBi model with a plain softmax, the naive model, x-transformers, and
    the tied plain softmax alone (for the reason column)."""
    plain_cand, plain, cfg = ours(opts, "alibi", x, y, ["model.adaptive_cutoffs=null"], PLAIN, "peers")
    if plain is None:
        return [plain_cand]
    lm, device = plain_cand.lm, opts.device
    torch.manual_seed(0)
    naive = NaiveALiBiLM(lm).to(device)
    out = [plain_cand, Candidate("naive", "peers", "naive", "plain", "by hand", lm,
                                 train_step_fn(naive, naive, x, y, cfg, device))]
    try:
        torch.manual_seed(0)
        xt = x_transformers_lm(lm, x.shape[1]).to(device)
    except ImportError as e:
        log(f"  x-transformers unavailable ({e}); skipped")
    else:
        out.append(Candidate("x-transformers", "peers", "x-transformers", "plain", "x-transformers default", lm,
                             train_step_fn(xt, x_transformers_loss(xt), x, y, cfg, device)))
    h = torch.randn(*x.shape, lm.d_model, device=device, requires_grad=True)

    def output_layer_only():
        with amp_context(device):
            loss = plain.vocab.nll(h, y).mean()
        loss.backward()
        h.grad = None
        plain.zero_grad(set_to_none=True)

    out.append(Candidate(OUTPUT_ONLY, "internal", "alibi-lm", "plain", "", lm, output_layer_only))
    return out


def ratio_pairs(cands: list[Candidate], peers: bool) -> list[tuple[str, str]]:
    """(numerator, denominator) of every ratio the rounds must pin down."""
    names = {c.name for c in cands if c.step}
    pairs = [(c.name, c.baseline) for c in cands if c.baseline and c.step]
    if peers:
        pairs += PEER_PAIRS
    return [(a, b) for a, b in pairs if a in names and b in names]


def train_row(c: Candidate, timings: Timings, L: int, batch: int, targets: np.ndarray) -> TrainRow:
    backend = c.backend() if callable(c.backend) else c.backend
    row = TrainRow(c.section, c.name, c.impl, c.softmax, backend, L, batch, c.lm, note=c.note,
                   why=c.why() if c.why else "")
    if c.step is None or c.name in timings.failed:
        row.note = row.note or f"{timings.failed.get(c.name, 'not run')} at batch {batch} x {L}"
        return row
    row.step_ms, row.tokens_per_s, row.rounds, row.rep_spread = timings.throughput(c.name, batch * L)
    if c.baseline:
        row.ratio, row.ratio_to = timings.ratio(c.name, c.baseline), c.baseline
    if c.lm is not None and c.section != "internal":
        count = flops_per_token(c.lm, L, targets)
        row.n_params_flops, row.attention_flops_per_token = count.n_weights, count.attention
        row.flops_per_token = count.per_token
    return row


def peer_ratio_rows(timings: Timings, L: int) -> list[PeerRatioRow]:
    ratios = {(ours_name, peer): timings.ratio(ours_name, peer) for ours_name, peer in PEER_PAIRS}
    return [PeerRatioRow(L, ours_name, peer, COMPARISONS[ours_name], ratio)
            for (ours_name, peer), ratio in ratios.items() if ratio is not None]


def train_one_length(opts: Options, L: int, log) -> tuple[list[TrainRow], list[PeerRatioRow]]:
    batch = max(1, opts.tokens_per_step // L)
    data = torch.from_numpy(zipf_tokens((batch, L + 1), seed=L)).to(opts.device)
    x, y = data[:, :-1], data[:, 1:]
    cands = scheme_candidates(opts, x, y)
    peers = opts.peers and "alibi" in opts.schemes
    if peers:
        cands += peer_candidates(opts, x, y, log)
    fns = {c.name: c.step for c in cands if c.step}
    pairs = ratio_pairs(cands, peers)
    plan = opts.train_plan
    log(f"L={L}: {len(fns)} models, batch {batch} x {L}, {len(pairs)} ratios; {plan.min_rounds}-{plan.max_rounds} "
        f"paired rounds (until every interval is within ±{plan.tolerance:.0%}) after {plan.warmup} warm-up")
    timings = run_rounds(fns, pairs, plan, opts.device, log)
    still = [f"{a}/{b}" for a, b in pairs if not ((r := timings.ratio(a, b)) and r.within(plan.tolerance))]
    shares = sorted(timings.others.values()) or [float("nan")]
    log(f"L={L}: {timings.rounds} rounds, {len(timings.disturbed_rounds())} disturbed (other processes above "
        f"{plan.quiet or 0:.0%} of the cores; per round median {shares[len(shares) // 2]:.1%}, max {shares[-1]:.1%})"
        + (f"; wider than ±{plan.tolerance:.0%}: {', '.join(still)}" if still else
           f"; every interval within ±{plan.tolerance:.0%}"))
    targets = y.cpu().numpy()
    return [train_row(c, timings, L, batch, targets) for c in cands], peer_ratio_rows(timings, L)


def section_training(opts: Options, log) -> tuple[list[TrainRow], list[PeerRatioRow]]:
    rows, ratios = [], []
    for L in opts.lengths:
        got, peer = train_one_length(opts, L, log)
        rows += got
        ratios += peer
        gc.collect()
    return rows, ratios

