"""The perplexity tables that the READMEs quote (README.md's summary, results/cpu-wt2/README.md's main table) say
what the committed rows say: each cell is recomputed from results/cpu-wt2/extrapolation.csv, so a table can
neither drift from the data nor be edited by hand."""

from __future__ import annotations

import re

import pandas as pd
import pytest
from conftest import REPO

ROWS = pd.read_csv(REPO / "results" / "cpu-wt2" / "extrapolation.csv")
if "attention" not in ROWS:  # rows from before blockwise attention existed: full causal attention
    ROWS["attention"] = "full"
L, MULTIPLIERS = 128, (2, 8, 16)


def quoted_rows(readme: str, header: str) -> list[list[str]]:
    """The body of the markdown table whose header line starts with `header`, as lists of stripped cells."""
    lines = (REPO / readme).read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    body = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        body.append([cell.strip() for cell in line.strip("|").split("|")])
    return body


def spread(values: pd.Series, digits: int) -> str:
    """mean ± std over seeds, or the one value, as the report prints them."""
    if len(values) == 1:
        return f"{values.iloc[0]:.{digits}f}"
    return f"{values.mean():.{digits}f} ± {values.std():.{digits}f}"


def expected_cells(label: str) -> tuple[str, list[str]]:
    """ppl at L (n over seeds) and ppl(kL) / ppl(L) for k in MULTIPLIERS, per seed, then mean ± std."""
    name = re.split(r"[ (]", label)[0]  # "fire (threshold ...)" -> fire
    # a variant's rows carry its name (fox+rope); "rope+yarn" is the rope rows scored with that RoPE extension
    scheme, _, scaling = (name, "", "") if name in set(ROWS["position"]) else name.partition("+")
    rows = ROWS[(ROWS["mode"] == "nonoverlapping") & (ROWS["train_len"] == L) & (ROWS["position"] == scheme)
                & (ROWS["attention"].fillna("full") == "full")]  # the tables quote full attention; bca has its own
    plain = rows[rows["rope_scaling"].isna()].pivot_table(index="seed", columns="eval_len", values="ppl")
    scored = plain if not scaling else rows[rows["rope_scaling"] == scaling].pivot_table(
        index="seed", columns="eval_len", values="ppl")
    at_L = plain[L]
    ratios = [spread(scored[k * L] / at_L, 3) for k in MULTIPLIERS]
    return spread(at_L, 2) + (f" (n={len(at_L)})" if len(at_L) > 1 else ""), ratios


@pytest.mark.parametrize("readme, header, with_n", [
    ("README.md", "| scheme | ppl at L | 2L | 8L | 16L |", False),
    ("results/cpu-wt2/README.md", "| scheme | ppl at L | ours 2L |", True),
])
def test_the_quoted_perplexity_tables_match_the_committed_rows(readme, header, with_n):
    body = quoted_rows(readme, header)
    assert len(body) >= 11, "every scheme at L = 128 is quoted"
    for cells in body:
        ppl, ratios = expected_cells(cells[0])
        if not with_n:
            ppl = ppl.split(" (n=")[0]
        if cells[1] != "(rope's)":
            assert cells[1] == ppl, (readme, cells[0])
        assert cells[2:5] == ratios, (readme, cells[0])
