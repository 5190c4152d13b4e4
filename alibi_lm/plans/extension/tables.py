"""The comparison's tables, findings and plots, computed from its rows: scheme x method x Lv / L of perplexity,
key-token perplexity and its count (mean ± sd over seeds), the passkey probe's accuracy and relative effective length
(NoLiMa, results.task_learning.effective_length), the paired findings with their 95% t intervals, the attention on
the first tokens, the refusals. A fine-tune's rows are a column of their own (ft<s>x<f>, ft<s>x<f>-linear for RoPE
fine-tuned with Position Interpolation), the reference from scratch at s L another (scratch<s>x)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from ...errors import ConfigError
from ...extension import METHODS, REMAP_METHODS, check_scheme
from ...positions import POSITION_SCHEMES
from ...results import store
from ...results.markdown import cell_text, markdown_table
from ...results.task_learning import T95, Z95, effective_length

METHOD_NAMES = {"none", *METHODS}


def columns_of(df: pd.DataFrame) -> pd.DataFrame:
    """The nonoverlapping rows with a method column: the extension's label, a fine-tune's (+ft<s>x<f>, from the
    position label), scratch<s>x for a reference trained at s L (scored at the same lengths, so at L = the base)."""
    df = df[df["mode"] == "nonoverlapping"].copy()
    base = int(df["train_len"].min())
    method = df["rope_scaling"].replace("", "none")
    tuned = df["position"].str.contains(r"\+ft", regex=True)
    method[tuned] = df.loc[tuned, "position"].str.split("+").str[-1]
    scratch = df["train_len"] != base
    method[scratch] = "scratch" + (df.loc[scratch, "train_len"] // base).astype(str) + "x"
    return df.assign(method=method, position=df["position"].str.split("+").str[0], train_len=base)


def comparison(df: pd.DataFrame, metric: str) -> str:
    """A markdown table: one row per scheme and method, one column per Lv / L, mean ± sd (n seeds) of `metric`."""
    df = columns_of(df)
    ratios = sorted({int(r) for r in (df["eval_len"] / df["train_len"]).round()})
    header = ["scheme", "method", *[f"{r}L" for r in ratios]]
    rows = []
    for (scheme, method), cell in df.groupby(["position", "method"], sort=False):
        by_ratio = {r: cell.loc[(cell["eval_len"] / cell["train_len"]).round() == r, metric] for r in ratios}
        rows.append([scheme, method, *[cell_text(by_ratio[r], 1) for r in ratios]])
    rows.sort(key=lambda r: (r[0], r[1] != "none", r[1]))
    return markdown_table(header, rows)


def plot(df: pd.DataFrame, metric: str, path: Path) -> None:
    import matplotlib  # import cost: only the report draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = columns_of(df)
    schemes = list(dict.fromkeys(df["position"]))
    cols = min(4, len(schemes))
    fig, axes = plt.subplots(math.ceil(len(schemes) / cols), cols, figsize=(4 * cols, 3.2 * math.ceil(len(schemes) / cols)),
                             squeeze=False)
    for ax, scheme in zip(axes.flat, schemes):
        ax.set_prop_cycle(color=plt.cm.tab20.colors)  # up to 20 columns told apart
        for method, cell in df[df["position"] == scheme].groupby("method"):
            mean = cell.groupby("eval_len")[metric].mean().dropna()
            if len(mean):  # key-token ppl is empty where no target is key
                ax.plot(mean.index, mean.values, marker="o", ms=3, label=method, lw=2.5 if method == "none" else 1.2)
        ax.set(title=scheme, xscale="log", xlabel="Lv")
        if ax.lines:
            ax.set_yscale("log")
            ax.legend(fontsize=6)
        else:
            ax.text(0.5, 0.5, f"no {metric} values", ha="center", transform=ax.transAxes)
    for ax in axes.flat[len(schemes):]:
        ax.axis("off")
    fig.suptitle(f"{metric} by evaluation length, per scheme and extension (L = {int(df['train_len'].iloc[0])})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def t_interval(values: pd.Series) -> tuple[float, float, float, int]:
    """(mean, low, high, n): Student's t 95% interval of the mean over seeds (n < 2: no interval, nan)."""
    values = values.dropna().astype(float)
    n = len(values)
    if n < 2:
        return (float(values.mean()) if n else math.nan), math.nan, math.nan, n
    half = (T95[n - 2] if n - 1 <= len(T95) else Z95) * float(values.std(ddof=1)) / math.sqrt(n)
    return float(values.mean()), float(values.mean()) - half, float(values.mean()) + half, n


def task_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The scored rows of tasks.csv on the task as trained (no variant), with `method` ('none': the plain model):
    what the task table and the answers read."""
    df = df[(df["variant"].map(store.key_text) == "") & df["exact"].notna()]
    return df.assign(method=df["rope_scaling"].map(store.key_text).replace("", "none"))


def passkey_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Scored passkey rows with a method column ('none' for the plain model) and Lv / L."""
    df = df[df["acc"].notna()].copy()
    method = df["rope_scaling"].map(store.key_text) if "rope_scaling" in df else pd.Series("", index=df.index)
    return df.assign(method=method.replace("", "none"), ratio=(df["eval_len"] / df["train_len"]).round().astype(int))


def passkey_effective(df: pd.DataFrame) -> pd.DataFrame:
    """Per (scheme, method, seed): the relative effective length (results.task_learning.effective_length, NoLiMa's: the longest
    Lv up to which the accuracy, mean over depths, keeps 85% of its value at L), the accuracy at L and the no-key
    control's; effective_len is empty where the accuracy at L is 0 (nothing to keep 85% of)."""
    rows = []
    for (scheme, method, seed, L), part in passkey_rows(df).groupby(["position", "method", "seed", "train_len"]):
        acc = part.groupby("eval_len")["acc"].mean()  # (Lv,): mean over depths
        length = effective_length(acc.to_dict(), int(L))  # None where the accuracy at L is 0
        at_L = part[part["eval_len"] == L]
        nokey, gain = (at_L[c].mean() if c in at_L else math.nan for c in ("acc_nokey", "gain"))
        rows.append(dict(position=scheme, method=method, seed=seed, train_len=int(L), acc_at_L=acc.get(int(L), math.nan),
                         nokey_at_L=nokey, gain_at_L=gain, effective_len=length))
    return pd.DataFrame(rows)


def passkey_tables(df: pd.DataFrame) -> str:
    """Accuracy by Lv / L (mean over depths, mean ± sd over seeds) and the effective length per scheme x method."""
    if df.empty or "acc" not in df or df["acc"].notna().sum() == 0:
        return "(no passkey rows yet)\n"
    rows_, ratios = passkey_rows(df), sorted(passkey_rows(df)["ratio"].unique())
    per_seed = rows_.groupby(["position", "method", "seed", "ratio"])["acc"].mean().reset_index()
    eff = passkey_effective(df)
    table = []
    for (scheme, method), cell in per_seed.groupby(["position", "method"]):
        mine = eff[(eff["position"] == scheme) & (eff["method"] == method)].sort_values("seed")
        L = int(mine["train_len"].iloc[0])
        lengths = ", ".join("n/a" if pd.isna(v) else f"{int(v) // L}L" for v in mine["effective_len"])
        table.append([scheme, method, *[cell_text(cell.loc[cell["ratio"] == r, "acc"], 2) for r in ratios],
                      cell_text(mine["nokey_at_L"], 2), cell_text(mine["gain_at_L"], 2), lengths])
    table.sort(key=lambda r: (r[0], r[1] != "none", r[1]))  # as the perplexity tables
    return markdown_table(["scheme", "method", *[f"{r}L" for r in ratios], "no-key control at L",
                           "log-prob gain over no key at L (nats/digit)", "effective length per seed"], table)


def paired_findings(df: pd.DataFrame) -> list[str]:
    """Per scheme at the longest length: each training-free method's perplexity minus no method's, paired by seed
    (the same weights), with its 95% t interval; a method is named better or worse only where the interval
    excludes 0."""
    df = columns_of(df)
    longest = int((df["eval_len"] / df["train_len"]).max())
    at = df[(df["eval_len"] / df["train_len"]).round() == longest]
    lines = []
    for scheme, part in at.groupby("position"):
        ppl = part.pivot_table(index="seed", columns="method", values="ppl")  # (seeds, methods)
        if "none" not in ppl or len(ppl.dropna(subset=["none"])) < 2:
            continue
        better, worse, within = [], [], []
        for method in [m for m in ppl.columns if m in METHOD_NAMES and m != "none"]:
            mean, low, high, n = t_interval(ppl[method] - ppl["none"])
            if n < 2:
                continue
            text = f"{method} {mean:+.1f} [{low:+.1f}, {high:+.1f}] (n={n})"
            (better if high < 0 else worse if low > 0 else within).append(text)
        if not (better or worse or within):
            continue  # a scheme no method fits (sinusoidal)
        lines.append(f"{scheme} at {longest}L, perplexity minus no method's, paired by seed (n seeds), 95% t "
                     f"interval: lower: {'; '.join(better) or 'none'}. Higher: {'; '.join(worse) or 'none'}. Interval "
                     f"holds 0: {'; '.join(within) or 'none'}.")
    return lines


def findings(df: pd.DataFrame) -> list[str]:
    """Per scheme, at the longest length: no method, the best training-free method and the best other column."""
    df = columns_of(df)
    longest = int((df["eval_len"] / df["train_len"]).max())
    at = df[(df["eval_len"] / df["train_len"]).round() == longest].groupby(["position", "method"])["ppl"].mean()
    lines = []
    for scheme in dict.fromkeys(at.index.get_level_values(0)):
        cells = at[scheme].dropna()
        if "none" not in cells:
            continue
        free = cells[[m for m in cells.index if m in METHOD_NAMES and m != "none"]]
        other = cells[[m for m in cells.index if m not in METHOD_NAMES]]
        line = f"{scheme} at {longest}L: no method {cells['none']:.1f}"
        if len(free):
            line += f"; best training-free {free.idxmin()} {free.min():.1f}, worst {free.idxmax()} {free.max():.1f}"
        if len(other):
            line += f"; best fine-tune / reference {other.idxmin()} {other.min():.1f}"
        lines.append(line + ".")
    return lines


def sinks_table(path: Path) -> str:
    """Attention mass on the first SINK_TOKENS tokens: mean over layers and heads, and the largest head's."""
    if not path.is_file():
        return "(sinks.csv not computed yet)\n"
    sinks = pd.read_csv(path)
    # the runs trained at the base L (not fine-tunes, nor the references from scratch at s L)
    sinks = sinks[~sinks["position"].str.contains("+", regex=False) & (sinks["train_len"] == sinks["train_len"].min())]
    cells = sinks.groupby(["position", "extension", "eval_len"])["mass"].agg(["mean", "max"]).reset_index()
    return markdown_table(["scheme", "method", "Lv", "mean over heads", "largest head"],
                          [[r.position, r.extension, str(r.eval_len), f"{r.mean:.3f}", f"{r.max:.3f}"]
                           for r in cells.itertuples()])


def refusals(schemes: list[str]) -> list[str]:
    """The one-line refusal of each method a scheme has no use for."""
    lines = []
    for scheme in schemes:
        for method in REMAP_METHODS:
            try:
                check_scheme(REMAP_METHODS[method], POSITION_SCHEMES[scheme.split("+")[0]], scheme)
            except ConfigError as e:
                lines.append(str(e))
    return lines
