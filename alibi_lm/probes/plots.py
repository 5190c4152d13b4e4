"""The probes' figures (matplotlib, written atomically like the extrapolation plots)."""

from __future__ import annotations

from itertools import cycle
from pathlib import Path

import numpy as np
import pandas as pd

from ..positions import POSITION_SCHEMES
from ..results import plots as common
from ..results.store import scheme_order


def passkey_heatmap(df: pd.DataFrame, path: Path, title: str) -> None:
    """Depth (rows) x Lv (columns) for one scheme at one L, means over seeds: accuracy and the log-prob gains."""
    plt = common.pyplot()
    lengths, depths = sorted(df["eval_len"].unique()), sorted(df["depth"].unique())
    panels = [p for p in (("acc", "teacher-forced accuracy", "viridis", (0, 1)),
                          ("gain", "log-prob gain over no key (nats/token)", "RdBu", None),
                          ("copy_gain", "log-prob gain over another key (nats/token)", "RdBu", None)) if p[0] in df]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.0 + (1.1 * len(lengths) + 1.5) * len(panels),
                                                     2.2 + 0.45 * len(depths)), squeeze=False)
    gains = df[[p[0] for p in panels if p[3] is None]].to_numpy(dtype=float)
    # the gain panels share one scale centred on 0 (a model that only guesses is white), at least +-1 nat
    span = max(float(np.nanmax(np.abs(gains))) if np.isfinite(gains).any() else 0.0, 1.0)
    for ax, (col, label, cmap, limits) in zip(axes[0], panels):
        grid = df.pivot_table(index="depth", columns="eval_len", values=col, aggfunc="mean")
        values = grid.reindex(index=depths, columns=lengths).to_numpy(dtype=float)
        limits = limits or (-span, span)
        im = ax.imshow(values, cmap=cmap, vmin=limits[0], vmax=limits[1], aspect="auto")
        for (i, j), v in np.ndenumerate(values):
            if np.isfinite(v):
                dark = v < 0.5 if col == "acc" else abs(v) > 0.6 * limits[1]
                ax.text(j, i, f"{v:.2f}" if col == "acc" else f"{v:+.2f}", ha="center", va="center", fontsize=8,
                        color="white" if dark else "black")
        ax.set_xticks(range(len(lengths)), [str(x) for x in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        ax.set(xlabel="prompt length Lv (tokens)", ylabel="key depth (0 = start, 1 = just before the cue)", title=label)
        fig.colorbar(im, ax=ax, shrink=0.85)
    fig.suptitle(f"passkey retrieval: {title}", fontsize=11)
    common.save_figure(fig, path)


def context_curves(df: pd.DataFrame, path: Path) -> None:
    """Loss against context (log x), one line per model; right: minus its loss at c = L."""
    plt = common.pyplot()
    df = df[df["loss"].notna()]
    styles = dict(zip(sorted(df["train_len"].unique()), cycle(["-", "--", ":", "-."])))  # one per L
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    several_splits = df["split"].nunique() > 1
    others = [p for p in dict.fromkeys(df["position"]) if p not in POSITION_SCHEMES]  # hf:<model>: a colour each
    for key, curve in df.groupby(["position", "train_len", "seed", "split"], dropna=False, sort=False):
        position, L, seed, split = key
        curve = curve.sort_values("context")
        at_L = curve[(curve["context_lo"] <= L) & (curve["context_hi"] >= L)]["loss"]
        label = f"{position} L={L}" + ("" if pd.isna(seed) else f" s{int(seed)}") + (f" {split}" if several_splits else "")
        marker = common.OTHER_MARKERS[others.index(position) % len(common.OTHER_MARKERS)] if position in others else "."
        style = dict(color=common.scheme_color(position, others), ls=styles[L], lw=1.5, marker=marker, ms=3, label=label)
        axes[0].plot(curve["context"], curve["loss"], **style)
        if len(at_L):
            axes[1].plot(curve["context"], curve["loss"] - at_L.iloc[0], **style)
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter("{x:g}")  # plain numbers (64, 128, ...), not 2^6
        for L in styles:
            ax.axvline(L, color="k", ls="--", lw=0.8, alpha=0.5)
        ax.grid(True, alpha=0.3)
        ax.set_xlabel("tokens of context c (log scale; dashed: training lengths L)")
    axes[0].set(ylabel="mean loss (nats)", title="loss by context length")
    axes[1].axhline(0, color="k", lw=0.8)
    axes[1].set(ylabel="loss(c) - loss(L) (nats)", title="below 0 past L: context beyond L helps")
    axes[0].legend(fontsize=8, frameon=False, ncol=2)
    common.save_figure(fig, path)


def saturation_vs_L(summary: pd.DataFrame, path: Path) -> None:
    """c* against L per scheme; the diagonal c* = L; hollow markers: c* is the longest context measured."""
    plt = common.pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    schemes = scheme_order(summary["position"].unique())
    others = [p for p in schemes if p not in POSITION_SCHEMES]
    for i, scheme in enumerate(schemes):
        s = summary[summary["position"] == scheme]
        x = s["train_len"].to_numpy(dtype=float) * 2 ** ((i - (len(schemes) - 1) / 2) * 0.04)  # side by side
        ceiling = (s["c_star"] >= s["last_context"]).to_numpy()
        color = common.scheme_color(scheme, others)
        ax.scatter(x[~ceiling], s["c_star"][~ceiling], color=color, label=scheme, s=30)
        ax.scatter(x[ceiling], s["c_star"][ceiling], facecolors="none", edgecolors=color, s=30,
                   label=None if (~ceiling).any() else scheme)
    lo = min(summary["train_len"].min(), summary["c_star"].min()) / 2
    hi = max(summary["last_context"].max(), summary["train_len"].max()) * 2
    ax.plot([lo, hi], [lo, hi], color="k", lw=0.8, ls="--", label="c* = L")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.xaxis.set_major_formatter("{x:g}")  # plain numbers (64, 128, ...), not 2^6
    ax.yaxis.set_major_formatter("{x:g}")
    ax.set(xlim=(lo, hi), ylim=(lo, hi), xlabel="training length L", ylabel="saturation context c*",
           title="does any scheme use context beyond L?")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    common.save_figure(fig, path)
