"""Figures of the position schemes: ALiBi slopes and biases, T5 buckets and bias tables (make figures).

Options: --out results/figures, --heads 8, --length 32, --t5-checkpoint <t5 run folder or checkpoint.pt>.
"""

from __future__ import annotations

import platform
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch

from alibi_lm.checkpoint import load_checkpoint
from alibi_lm.errors import ArgumentParser, UserError
from alibi_lm.positions import alibi_bias, alibi_slopes, build_position_scheme, t5_relative_bucket
from alibi_lm.positions.t5 import T5RelativeBias
from alibi_lm.provenance import git_commit
from alibi_lm.results.plots import pyplot

from . import checkout_root

plt = pyplot()  # the Agg backend: files only


def plot_slopes(path: Path, heads: int) -> None:
    counts = [heads, 12 if heads != 12 else 6]  # the second panel shows a non-power-of-2 interleave
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), width_ratios=counts)
    for ax, n in zip(axes, counts):
        slopes = alibi_slopes(n).double().numpy()
        base = 2 ** int(np.floor(np.log2(n)))  # heads [0, base) geometric; the rest interleaved
        colors = ["tab:blue" if h < base else "tab:orange" for h in range(n)]
        bars = ax.bar(range(n), slopes, color=colors)
        ax.set_yscale("log", base=2)
        ax.set_ylim(2**-9, 2**2.5)  # headroom for the legend
        for bar, m in zip(bars, slopes):
            ax.text(bar.get_x() + bar.get_width() / 2, m * 1.1, f"$2^{{{np.log2(m):g}}}$", ha="center", fontsize=8)
        ax.set_xticks(range(n))
        ax.set_xlabel("head h")
        ax.set_ylabel("slope $m_h$ (log2 scale)")
        kind = f"power of 2: $m_h = 2^{{-8(h+1)/{n}}}$" if base == n else f"{base} geometric + {n - base} interleaved"
        ax.set_title(f"{n} heads ({kind})")
        if base != n:
            labels = [f"the {base}-head slopes", f"every other {2 * base}-head slope"]
            ax.legend(handles=[bars[0], bars[base]], labels=labels, loc="upper center", ncol=2, fontsize=9)
    fig.suptitle("ALiBi head slopes (official get_slopes)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bias_heads(path: Path, heads: int, length: int) -> None:
    pos = torch.arange(length)
    bias = alibi_bias(heads, pos, pos).numpy()  # (H, T, T), -inf above the diagonal
    bias = np.where(np.isinf(bias), np.nan, bias)  # NaN: drawn in the 'bad' colour
    slopes = alibi_slopes(heads).double().numpy()
    cols = min(4, heads)
    rows = -(-heads // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 3.2 * rows + 0.6), squeeze=False)
    cmap = plt.get_cmap("viridis").copy()
    cmap.set_bad("lightgrey")
    vmin = np.nanmin(bias)
    for h, ax in enumerate(axes.flat):
        if h >= heads:
            ax.axis("off")
            continue
        im = ax.imshow(bias[h], cmap=cmap, vmin=vmin, vmax=0.0)
        ax.set_title(f"head {h}: $m=2^{{{np.log2(slopes[h]):g}}}$, min {np.nanmin(bias[h]):.3g}", fontsize=10)
        ax.set_xlabel("key j", fontsize=8)
        ax.set_ylabel("query i", fontsize=8)
        ax.tick_params(labelsize=7)
    fig.suptitle(f"ALiBi causal bias $-m_h(i-j)$, T={length}, one shared colour scale (grey: future keys, masked)")
    fig.tight_layout(rect=(0, 0, 0.9, 1))
    fig.colorbar(im, cax=fig.add_axes((0.92, 0.15, 0.015, 0.7)), label="bias added to the score")
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_bias_vs_distance(path: Path, heads: int, length: int) -> None:
    bias = alibi_bias(heads, torch.arange(length), torch.arange(length)).numpy()  # (H, T, T)
    slopes = alibi_slopes(heads).double().numpy()
    chosen = sorted({0, heads // 2, heads - 1})  # one panel per head: each has its own y scale
    queries = sorted({min(8, length - 1), min(16, length - 1), length - 1})
    styles = [("o", "-", 10), ("s", "--", 6), ("^", ":", 3)]  # big hollow under small: overlap shows
    fig, axes = plt.subplots(1, len(chosen), figsize=(max(10, 5 * len(chosen)), 4.4), squeeze=False)
    for c, (ax, h) in enumerate(zip(axes[0], chosen)):
        for (marker, ls, size), i in zip(styles, queries):
            dist = i - np.arange(i + 1)  # i - j for j = 0..i
            line = dict(marker=marker, ms=size, mfc="none", color=f"C{c}", label=f"query i={i}")
            ax.plot(dist, bias[h, i, : i + 1], ls, **line)
        ax.set(xlabel="key distance i - j", ylabel="ALiBi bias", title=f"head {h}: $m=2^{{{np.log2(slopes[h]):g}}}$")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9, loc="lower left")
    fig.suptitle("ALiBi bias vs distance: the lines of different query positions i overlap exactly\n"
                 "(the bias depends only on i - j; a later query just extends the same line)")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def t5_scheme(heads: int, checkpoint: str | None) -> tuple[T5RelativeBias, str]:
    if checkpoint is None:
        torch.manual_seed(0)
        scheme = T5RelativeBias(n_head=heads, d_model=heads * 8)  # as TransformerLM builds it: a zero table
        return scheme, "untrained (zero init: every bucket adds 0)"
    try:
        state = load_checkpoint(Path(checkpoint))
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    cfg = state["model_config"]
    if cfg["position"] != "t5":
        raise SystemExit(f"error: {checkpoint} is a {cfg['position']!r} run, not t5")
    scheme = build_position_scheme("t5", cfg["n_head"], cfg["d_model"], **cfg.get("position_options", {}))
    (table,) = [v for k, v in state["model"].items() if k.endswith("position.bias_table.weight")]
    scheme.bias_table.weight.data.copy_(table)
    return scheme, f"trained ({checkpoint})"


def plot_t5(path: Path, scheme: T5RelativeBias, label: str) -> None:
    nb, md = scheme.num_buckets, scheme.max_distance
    dist = torch.arange(301)
    buckets = t5_relative_bucket(-dist, num_buckets=nb, max_distance=md).numpy()  # key - query = -distance
    table = scheme.bias_table.weight.detach().double().numpy().T  # (H, buckets)
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.6))
    last = int(np.argmax(buckets == buckets.max()))  # first distance in the last bucket
    ax = axes[0]
    ax.step(dist.numpy(), buckets, where="post")
    for x, text in ((nb // 2, f"{nb // 2}: log-spaced from here"), (last, f"{last}: last bucket from here")):
        ax.axvline(x, color="grey", ls="--", lw=0.8)
        ax.text(x * 1.05, 1, text, rotation=90, fontsize=8, va="bottom")
    ax.set(xlabel="distance i - j (symlog)", ylabel="bucket", title=f"causal buckets ({nb} buckets, max_distance {md})")
    ax = axes[1]
    lim = np.abs(table).max()
    im = ax.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set(xlabel="bucket", ylabel="head", title="bias table (heads x buckets)")
    ax.set_yticks(range(table.shape[0]))
    fig.colorbar(im, ax=ax, label="bias")
    ax = axes[2]
    bias = scheme.score_bias(torch.tensor([300]), 300 - dist)[:, 0].detach().numpy()  # (H, 301)
    shown = min(4, bias.shape[0])  # a few heads: more lines are unreadable
    for h in range(shown):
        ax.plot(dist.numpy(), bias[h], lw=1.2, drawstyle="steps-post", label=f"head {h}")
    ax.set(
        xlabel="distance i - j (symlog)",
        ylabel="bias",
        title=f"bias vs distance, heads 0-{shown - 1} (flat from {last} on)",
    )
    ax.legend(fontsize=8, ncol=2)
    for ax in axes[[0, 2]]:
        ax.set_xscale("symlog", linthresh=nb // 2)  # linear over the exact buckets, log after
        ax.set_xlim(0, dist[-1].item())
    fig.suptitle(f"T5 relative position bias: {label}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


COMMITTED = checkout_root() / "results" / "figures"
# The committed T5 figure shows a trained table: regenerating results/figures without one would replace it
COMMITTED_T5_HINT = ("results/figures holds a trained T5 table (from runs/quick/t5-L64-seed0, which `make sweep` trains); "
                     "pass ARGS=\"--t5-checkpoint <a t5 run folder>\", or --out <another folder> for an untrained one")


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/figures", help="folder for the PNGs")
    parser.add_argument("--heads", type=int, default=8, help="number of attention heads")
    parser.add_argument("--length", type=int, default=32, help="sequence length T of the bias heatmaps")
    parser.add_argument("--t5-checkpoint", default=None, help="a t5 run folder or checkpoint.pt (default: untrained, "
                        "all zero; not into results/figures, whose T5 figure shows a trained table)")
    args = parser.parse_args()
    if args.heads < 1 or args.length < 2:
        parser.error("--heads must be >= 1 and --length >= 2")
    if args.t5_checkpoint is None and Path(args.out).resolve() == COMMITTED:
        print(f"error: {COMMITTED_T5_HINT}", file=sys.stderr)
        sys.exit(2)
    t5, t5_label = t5_scheme(args.heads, args.t5_checkpoint)  # a bad checkpoint fails before any file is written
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = {
        "alibi_slopes.png": lambda p: plot_slopes(p, args.heads),
        "alibi_bias_heads.png": lambda p: plot_bias_heads(p, args.heads, args.length),
        "alibi_bias_vs_distance.png": lambda p: plot_bias_vs_distance(p, args.heads, args.length),
        "t5_relative_bias.png": lambda p: plot_t5(p, t5, t5_label),
    }
    t0 = time.perf_counter()
    for name, draw in figures.items():
        draw(out / name)
        print(f"wrote {out / name}")
    commit = git_commit(mark_dirty=True)
    (out / "README.md").write_text(
        "# Position-scheme figures\n\n"
        f"- command: `python scripts/visualize_positions.py {shlex.join(sys.argv[1:])}` (`make figures`)\n"
        f"- commit: {commit or 'unknown'}; {platform.machine()}, torch {torch.__version__}; "
        f"wall time {time.perf_counter() - t0:.1f} s\n"
        f"- T5 table: {t5_label}\n\n"
        + "".join(f"![{name}]({name})\n" for name in figures))


if __name__ == "__main__":
    main()
