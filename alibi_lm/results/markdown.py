"""The markdown pieces every report writes: tables and mean ± std (n) cells."""

from __future__ import annotations

import pandas as pd


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def cell_text(values: pd.Series, digits: int = 2) -> str:
    """mean ± std (n) of a cell's rows; n/a where every row is not applicable (a learned table past its end)."""
    if values.empty:
        return ""
    values = values.dropna()
    if values.empty:
        return "n/a"
    mean = values.mean()
    return f"{mean:.{digits}f}" if len(values) == 1 else f"{mean:.{digits}f} ± {values.std():.{digits}f} (n={len(values)})"
