"""The figures of the results: perplexity against evaluation length (Figure 1) and the loss by position
inside the window, and the shared look (a scheme's colour, an extension's line style, files written
atomically) that the probes' figures use too.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

from ..checkpoint import atomic_file
from ..positions import POSITION_SCHEMES
from ..positions.rope import ROPE_SCALINGS, scaling_rank
from .store import cell_stats, protocol_name, protocols, scheme_order


def scheme_color(name: str, others: list[str] = ()) -> tuple:
    """The same colour for a scheme in every plot: its place in the registry picks from tab10, then Dark2, then
    Set1 (27 distinct colours: a later scheme must not share an earlier one's); an extension such as
    rope+yarn takes its scheme's colour, dashed. A subject outside the registry (hf:<model>) takes the
    colour after the registry's of its place in `others`, the plot's list of such subjects."""
    import matplotlib

    palette = [c for cmap in ("tab10", "Dark2", "Set1") for c in matplotlib.colormaps[cmap].colors]
    base = name.split("+")[0]
    known = [*POSITION_SCHEMES]
    place = known.index(base) if base in known else len(known) + [*others, base].index(base)
    return palette[place % len(palette)]


OTHER_MARKERS = ["s", "^", "v", "D", "P", "X", "*", "h", "<", ">"]  # subjects outside the registry


EXTENSION_STYLES = [dict(ls="--", marker="s"), dict(ls=":", marker="^"), dict(ls="-.", marker="v"),
                    dict(ls=(0, (5, 1, 1, 1, 1, 1)), marker="D"), dict(ls=(0, (3, 1)), marker="P"),
                    dict(ls=(0, (1, 1)), marker="X"), dict(ls=(0, (5, 2)), marker="*"), dict(ls=(0, (3, 1, 1, 1)), marker="h"),
                    dict(ls=(0, (1, 2)), marker="<"), dict(ls=(0, (7, 2, 2, 2)), marker=">"),
                    dict(ls=(0, (2, 2)), marker="d"), dict(ls=(0, (4, 1, 4, 1, 1, 1)), marker="p"),
                    dict(ls=(0, (6, 1, 1, 1)), marker="H"), dict(ls=(0, (1, 3)), marker="8"),
                    dict(ls=(0, (8, 3)), marker="1"), dict(ls=(0, (2, 1, 2, 3)), marker="2"),
                    dict(ls=(0, (4, 2, 1, 2, 1, 2)), marker="3")]
# what follows a scheme's name after "+", in the order that picks its style: the RoPE extensions, evaluation's
# attention settings, then the variants' options (an unknown one takes the style after them, shared)
VARIANT_KINDS = ("bca", "temperature", "bca+temperature", "ssmax", "learn_slopes", "qk_norm", "rope", "nope", "nope-w",
                 "nope-c", "fraction")


# rope+nope4+temperature: the variant's style with these markers, so that it stays apart from rope+nope4
EVALUATION_FILLS = {"bca+temperature": "right", "temperature": "none", "bca": "left"}


def line_style(name: str) -> dict:
    """A trained scheme: solid with dots; an inference-time extension (rope+yarn), an evaluation setting
    (xpos+bca) or a variant (alibi+ssmax, rope+nope4-w64): its scheme's colour with its own dash and marker, so
    that a scheme's variants stay apart in one plot."""
    if "+" not in name:
        return dict(ls="-", marker="o")
    scheme, method = name.split("+", 1)  # yarn-x4 (a fixed factor) styles as yarn
    for setting, fill in EVALUATION_FILLS.items():  # a variant scored with an evaluation setting: hollow markers
        if method.endswith(f"+{setting}") or (setting == "temperature" and "+temperature-" in method):
            head = method[: method.rindex(f"+{setting}")]
            return dict(line_style(f"{scheme}+{head}"), fillstyle=fill)
    rank = scaling_rank(method)
    if rank == len(ROPE_SCALINGS):  # not a RoPE extension: its kind, numbers left out (nope4-w64: nope-w)
        kind = re.sub(r"[\d.]+", "", method).rstrip("-")
        rank += VARIANT_KINDS.index(kind) if kind in VARIANT_KINDS else next(
            (i for i, k in enumerate(VARIANT_KINDS) if kind.startswith(k)), len(VARIANT_KINDS))
    return EXTENSION_STYLES[rank % len(EXTENSION_STYLES)]


def pyplot():
    """matplotlib.pyplot, drawing to files only (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path) -> None:
    """Lay out fig (unless it has a layout engine of its own), write it to path as a PNG (atomically, as every
    table) and close it."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with atomic_file(path) as f:
        fig.savefig(f, format="png", dpi=130, bbox_inches="tight")
    pyplot().close(fig)


def _length_axis(ax, lengths) -> None:
    """A tick at every eval length (log2 axis when they span 4x or more); labels that would overlap are
    left out (512, 612, 712 -> 512, 712)."""
    lengths = sorted(set(int(x) for x in lengths))
    log = bool(lengths) and lengths[-1] >= 4 * lengths[0]
    if log:
        ax.set_xscale("log", base=2)
    where = np.log2(lengths) if log else np.array(lengths, dtype=float)
    gap = (where[-1] - where[0]) / 16 if len(lengths) > 1 else 0
    labels, last = [], -np.inf
    for x, w in zip(lengths, where):
        labels.append(str(x) if w - last >= gap else "")
        last = w if labels[-1] else last
    ax.set_xticks(lengths, labels)
    ax.minorticks_off()


def _log_y(ax, values) -> None:
    """Log y labelled with plain numbers, about ten of them (matplotlib's default labels only 10^k, which a range
    of one or two decades may not hold)."""
    from matplotlib.ticker import LogLocator

    decades = math.log10(float(np.max(values)) / float(np.min(values)))
    subs = (1, 1.5, 2, 3, 5, 7) if decades < 1.6 else (1, 2, 5) if decades < 3.3 else (1,)
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=subs))
    ax.yaxis.set_major_formatter(lambda v, _: f"{v:g}")  # matplotlib wraps it in a FuncFormatter
    ax.minorticks_off()


def mark_train_len(ax, L: int | None) -> None:
    """A dashed line at Lv = L (none where L is not known: a Hugging Face model whose config names none)."""
    if L is not None:
        ax.axvline(L, color="k", ls="--", lw=1, alpha=0.6)
        ax.text(L, 1.0, f" L = {L}", transform=ax.get_xaxis_transform(), va="top", ha="left", fontsize=9)


MAX_LINES = 8  # more schemes than this in one panel cannot be told apart: the figure adds small multiples
GROUP_SIZE = 5  # schemes per small multiple


def plot_extrapolation(df: pd.DataFrame, L: int | None, path: Path, title: str) -> None:
    """Perplexity vs Lv at training length L (None: the rows whose L is not known): one line per scheme; one
    panel per protocol. With more than MAX_LINES schemes, the main protocol's ratios ppl(Lv) / ppl(L) follow in
    small multiples of GROUP_SIZE schemes, alike curves together, each line labelled at its end (ratio_groups)."""
    plt = pyplot()
    df = df[df["train_len"].isna()] if L is None else df[df["train_len"].eq(L).fillna(False)]
    split = "valid" if (df["split"] == "valid").any() else sorted(df["split"].unique())[0]
    panels = [(p, sub) for p, sub in protocols(df) if p[2] == split]
    curves = ratio_curves(panels[0][1], L) if L is not None else {}
    groups = [list(g) for g in np.array_split(sorted(curves, key=lambda s: curves[s][1][-1]),
                                               math.ceil(len(curves) / GROUP_SIZE))] if len(curves) > MAX_LINES else []
    if not groups:
        fig, axes = plt.subplots(1, len(panels), figsize=(7.6 * len(panels), 4.6), squeeze=False)
        top = fig
    else:  # the overview on top, the small multiples below it, three a row
        rows = math.ceil(len(groups) / 3)
        fig = plt.figure(figsize=(max(7.6 * len(panels), 16.0), 4.6 * (1 + rows)), layout="constrained")
        top, bottom = fig.subfigures(2, 1, height_ratios=[1, rows])
        axes = top.subplots(1, len(panels), squeeze=False)
        small = bottom.subplots(rows, 3, squeeze=False).ravel()
        for ax in small[len(groups):]:
            ax.set_visible(False)
        ratio_groups(small, groups, curves, L)
        bottom.suptitle(f"{protocol_name(*panels[0][0])}: ppl(Lv) / ppl(L), alike curves together, ppl(L) in "
                        f"brackets", fontsize=11)
    for ax, ((mode, stride, _), sub) in zip(axes[0], panels):
        stats = cell_stats(sub, ["position", "eval_len"]).sort_values("eval_len")
        order = scheme_order(stats["position"])
        others = [n for n in order if n.split("+")[0] not in POSITION_SCHEMES]  # hf:<model>: a colour and marker each
        for scheme in order:
            s = stats[stats["position"] == scheme]
            x, y, std = (s[c].to_numpy(dtype=float, na_value=np.nan) for c in ("eval_len", "mean", "std"))
            color, style = scheme_color(scheme, others), line_style(scheme)
            if scheme in others:
                style["marker"] = OTHER_MARKERS[others.index(scheme) % len(OTHER_MARKERS)]
            ax.plot(x, y, ms=4, lw=1.8, label=scheme, color=color, **style)
            if (s["n"] > 1).any():
                ax.fill_between(x, y - std, y + std, alpha=0.15, color=color, lw=0)
        finite = stats["mean"][np.isfinite(stats["mean"])]
        if len(finite) and finite.max() > 10 * finite.min():  # Figure 1: sinusoidal blows up by orders
            _log_y(ax, finite)
        mark_train_len(ax, L)
        _length_axis(ax, stats["eval_len"])
        ax.set(xlabel="evaluation length Lv (tokens)", ylabel=f"perplexity ({split})",
               title=protocol_name(mode, stride, split))
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0),  # beside: lines stay visible
                  ncols=1 + len(order) // 16)  # columns of at most 16 names: the legend stays as tall as the panel
    top.suptitle(f"{title}: trained at " + ("an unknown L" if L is None else f"L = {L}"), fontsize=11)
    save_figure(fig, path)


def ratio_curves(rows: pd.DataFrame, L: int) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    """scheme -> (Lv, ppl(Lv) / ppl(L), ppl(L)) from the means over seeds, for the schemes scored past L; an
    extension without a row at L (rope+yarn) is divided by its scheme's ppl(L)."""
    stats = cell_stats(rows, ["position", "eval_len"]).sort_values("eval_len")
    at_L = stats[stats["eval_len"] == L].set_index("position")["mean"]
    curves = {}
    for scheme in scheme_order(stats["position"]):
        s = stats[(stats["position"] == scheme) & np.isfinite(stats["mean"])]
        base = at_L.get(scheme, at_L.get(scheme.split("+")[0], np.nan))
        if len(s) >= 2 and np.isfinite(base) and (s["eval_len"] > L).any():
            curves[scheme] = (s["eval_len"].to_numpy(dtype=float), s["mean"].to_numpy(dtype=float) / base, float(base))
    return curves


def spread(targets: np.ndarray, gap: float, low: float, high: float) -> np.ndarray:
    """Label positions near the targets, in their order, at least `gap` apart, centred on the targets' centre and
    kept inside [low, high] where they fit."""
    order = np.argsort(targets)
    placed = np.maximum.accumulate(targets[order] - gap * np.arange(len(order))) + gap * np.arange(len(order))
    placed += targets.mean() - placed.mean()
    placed -= max(placed[-1] - high, 0.0)
    placed += max(low - placed[0], 0.0)
    out = np.empty_like(placed)
    out[order] = placed
    return out


def ratio_groups(axes, groups: list[list[str]], curves: dict, L: int) -> None:
    """Small multiples of ratio curves ppl(Lv) / ppl(L), one group of alike schemes each, each on its own y scale (so
    that flat curves a few percent apart stay apart); each line labelled at its end with its scheme and ppl(L),
    labels spread so that none overlap."""
    others = [s for group in groups for s in group if s.split("+")[0] not in POSITION_SCHEMES]
    for ax, group in zip(axes, groups):
        ratios = np.concatenate([curves[s][1] for s in group])
        low, high = min(ratios.min(), 0.99) / 1.02, max(ratios.max(), 1.01) * 1.02
        log = high / low > 2
        for scheme in group:
            x, y, _ = curves[scheme]
            style = line_style(scheme)
            if scheme in others:
                style["marker"] = OTHER_MARKERS[others.index(scheme) % len(OTHER_MARKERS)]
            ax.plot(x, y, ms=3, lw=1.6, color=scheme_color(scheme, others), **style)
        ax.axhline(1.0, color="k", lw=0.8, alpha=0.5)
        if log:
            _log_y(ax, np.array([low, high]))
        ax.set_ylim(low, high)
        scale = np.log if log else (lambda v: np.asarray(v, dtype=float))
        ends = np.array([scale(curves[s][1][-1]) for s in group])
        gap = (scale(high) - scale(low)) / 14
        placed = spread(ends, gap, scale(low) + gap / 2, scale(high) - gap / 2)
        inverse = np.exp if log else (lambda v: v)
        for scheme, at in zip(group, placed):
            x, _, ppl_L = curves[scheme]
            ax.annotate(f"{scheme} ({ppl_L:.1f})", xy=(x[-1], curves[scheme][1][-1]), xytext=(x[-1] * 1.25, inverse(at)),
                        fontsize=8, va="center", color=scheme_color(scheme, others),
                        arrowprops=dict(arrowstyle="-", lw=0.5, color="0.6"))
        lengths = sorted({int(v) for s in group for v in curves[s][0]})
        _length_axis(ax, lengths)
        ax.set_xlim(lengths[0] / 1.2, lengths[-1] * 6)  # room for the labels right of the line ends
        mark_train_len(ax, L)
        ax.set(xlabel="evaluation length Lv (tokens)", ylabel="ppl(Lv) / ppl(L)")
        ax.grid(True, which="major", alpha=0.3)


PER_POSITION_FILE = re.compile(r"^(?P<prefix>.+)-Lv(?P<lv>\d+)\.csv$")
PER_POSITION_MIN_TOKENS = 8192  # scored tokens per bin: a standard error of about 0.03 nats at a loss std of 2.5


def position_bins(positions: np.ndarray, counts: np.ndarray, per_octave: int = 4,
                  min_tokens: int = PER_POSITION_MIN_TOKENS) -> np.ndarray:
    """Bin index of each position in the window: log-spaced bins (per_octave of them per doubling of
    position + 1), then neighbours merged until each bin holds min_tokens scored tokens (the last one
    joins its left neighbour when short). At Lv = 16L there are only a few hundred windows, so single
    positions are noise; the bins trade early-position detail for a mean that can be read."""
    log_bin = np.floor(np.log2(positions + 1) * per_octave + 1e-9).astype(int)  # (n,) per_octave bins per doubling
    bins, b, start, total = np.zeros(len(positions), dtype=int), 0, 0, 0
    for i in range(len(positions)):
        total += counts[i]
        end_of_log_bin = i + 1 == len(positions) or log_bin[i + 1] != log_bin[i]
        bins[i] = b
        if end_of_log_bin and total >= min_tokens:
            b, total, start = b + 1, 0, i + 1
    if start < len(positions) and b > 0:  # a short tail bin joins the one before it
        bins[start:] = b - 1
    return bins


def plot_per_position(per_position_dir: Path, prefix: str, L: int | None) -> Path | None:
    """Mean loss by position inside the window, one line per Lv, from <prefix>-Lv*.csv -> <prefix>.png,
    averaged over log-spaced position bins of at least PER_POSITION_MIN_TOKENS tokens (position_bins):
    they show the first tokens' high loss (the early-token curse) and an absolute scheme breaking past L."""
    plt = pyplot()
    per_position_dir = Path(per_position_dir)
    files = sorted((int(m["lv"]), p) for p in per_position_dir.glob(f"{prefix}-Lv*.csv")
                   if (m := PER_POSITION_FILE.match(p.name)) and m["prefix"] == prefix)
    if not files:
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    cmap = plt.get_cmap("viridis")
    for i, (lv, p) in enumerate(files):
        d = pd.read_csv(p).dropna(subset=["mean_loss"])
        d = d[d["count"] > 0].sort_values("position_in_window")
        pos, w = d["position_in_window"].to_numpy(), d["count"].to_numpy(dtype=float)  # (n,), (n,)
        bins = position_bins(pos, w)
        den = np.bincount(bins, weights=w)
        loss = np.bincount(bins, weights=d["mean_loss"].to_numpy() * w) / den
        x = np.bincount(bins, weights=(pos + 1) * w) / den  # token-weighted mean position of the bin
        ax.plot(x, loss, lw=1.5, marker=".", ms=4, label=f"Lv = {lv}", color=cmap(i / max(len(files) - 1, 1) * 0.9))
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:g}")  # matplotlib wraps it in a FuncFormatter
    mark_train_len(ax, L)
    ax.set(xlabel="position in the evaluation window (1 = first target, log scale)", ylabel="mean loss (nats)",
           title=f"{prefix}: loss by position in the window\n"
                 f"(log-spaced bins of >= {PER_POSITION_MIN_TOKENS:,} scored tokens)")
    ax.grid(True, which="both", alpha=0.25)
    ax.legend(fontsize=9, frameon=False)
    out = per_position_dir / f"{prefix}.png"
    save_figure(fig, out)
    return out
