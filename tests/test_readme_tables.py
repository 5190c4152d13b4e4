"""The perplexity tables that the READMEs quote (README.md's summary, results/cpu-wt2/README.md's main table) say
what the committed rows say: each cell is recomputed from results/cpu-wt2/extrapolation.csv
(scripts/readme_tables.py, whose --write rewrites them), so a table can neither drift from the data nor be
edited by hand."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import REPO

from scripts import readme_tables


@pytest.mark.parametrize("readme, header", readme_tables.TABLES)
def test_the_quoted_perplexity_tables_match_the_committed_rows(readme, header):
    rows = readme_tables.load_rows()
    lines = (REPO / readme).read_text(encoding="utf-8").splitlines()
    body = [readme_tables.cells_of(lines[i]) for i in readme_tables.table_lines(lines, header)]
    assert len(body) >= 11, "every scheme at L = 128 is quoted"
    for cells in body:
        assert readme_tables.corrected(rows, cells) == cells, (readme, cells[0])


def test_the_recomputation_follows_the_rows():
    """A changed row changes the expected cell (the check can fail), and blockwise rows never enter it."""
    rows = readme_tables.load_rows()
    label = "alibi"
    before = readme_tables.expected_cells(rows, label)
    changed = rows.copy()
    at_16L = (changed["position"] == "alibi") & (changed["eval_len"] == 16 * 128) & (changed["seed"] == 0)
    bca = changed[at_16L & (changed["attention"] == "full")].assign(attention="bca", ppl=1e6)
    assert readme_tables.expected_cells(pd.concat([changed, bca]), label) == before
    changed.loc[at_16L & (changed["attention"] == "full") & (changed["mode"] == "nonoverlapping"), "ppl"] *= 1.5
    assert readme_tables.expected_cells(changed, label)[1][2] != before[1][2]
