"""The perplexity tables that the READMEs quote (README.md's headline rows, results/cpu-wt2/README.md's main table) say
what the committed rows say: each cell is recomputed from results/cpu-wt2/extrapolation.csv
(scripts/readme_tables.py, whose --write rewrites them), so a table can neither drift from the data nor be
edited by hand; results/cpu-wt2/README.md's copy of extrapolation.md's findings table must equal it."""

from __future__ import annotations

import pandas as pd
import pytest
from conftest import REPO

from alibi_lm.plans import readme_tables


@pytest.mark.parametrize("readme, header", readme_tables.TABLES)
def test_the_quoted_perplexity_tables_match_the_committed_rows(readme, header):
    rows = readme_tables.load_rows()
    lines = (REPO / readme).read_text(encoding="utf-8").splitlines()
    body = [readme_tables.cells_of(lines[i]) for i in readme_tables.table_lines(lines, header)]
    # the README quotes Press et al.'s four schemes and a few others; the results README every scheme at L = 128
    assert len(body) >= (5 if readme == "README.md" else 11)
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


@pytest.mark.parametrize("readme, report, header", readme_tables.COPIED)
def test_a_copied_report_table_is_the_report_s(readme, report, header):
    lines = (REPO / readme).read_text(encoding="utf-8").splitlines()
    start, end = readme_tables.copied_table(lines, header)
    assert end - start >= 3, "a header, its separator and at least one row"
    assert not readme_tables.sync_copied(readme, report, header, write=False), "run python scripts/readme_tables.py --write"


def test_sync_copied_rewrites_only_the_copy(tmp_path, monkeypatch):
    """A stale copy is reported and replaced by the report's table; the text around it stays."""
    (tmp_path / "report.md").write_text("# r\n\n| finding | criterion |\n|---|---|\n| a | new |\n\nafter\n")
    (tmp_path / "README.md").write_text("intro\n\n| finding | criterion |\n|---|---|\n| a | old |\n| b | gone |\n\nend\n")
    monkeypatch.setattr(readme_tables, "ROOT", tmp_path)
    assert readme_tables.sync_copied("README.md", "report.md", "| finding | criterion |", write=False)
    assert "old" in (tmp_path / "README.md").read_text()
    assert readme_tables.sync_copied("README.md", "report.md", "| finding | criterion |", write=True)
    assert (tmp_path / "README.md").read_text() == "intro\n\n| finding | criterion |\n|---|---|\n| a | new |\n\nend\n"
    assert not readme_tables.sync_copied("README.md", "report.md", "| finding | criterion |", write=False)
