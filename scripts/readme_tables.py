"""The perplexity tables that README.md and results/cpu-wt2/README.md quote, recomputed from
results/cpu-wt2/extrapolation.csv: ppl at L = 128 over seeds, and ppl(kL) / ppl(L) per seed, then mean ± std,
for k = 2, 8, 16 (nonoverlapping, full attention; "rope+yarn" rows: the rope runs scored with that extension,
against rope's ppl at L). tests/test_readme_tables.py checks the READMEs against it.

    python scripts/readme_tables.py           # list the cells that differ from the rows (exit 1 if any)
    python scripts/readme_tables.py --write   # rewrite those cells in both READMEs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from alibi_lm.results.report import cell_text

ROOT = Path(__file__).resolve().parents[1]
L, MULTIPLIERS = 128, (2, 8, 16)
TABLES = (  # (README, the first characters of its table's header line)
    ("README.md", "| scheme | ppl at L | 2L | 8L | 16L |"),
    ("results/cpu-wt2/README.md", "| scheme | ppl at L | ours 2L |"),
)


def load_rows(root: Path = ROOT) -> pd.DataFrame:
    rows = pd.read_csv(root / "results" / "cpu-wt2" / "extrapolation.csv")
    if "attention" not in rows:  # rows from before blockwise attention existed: full causal attention
        rows["attention"] = "full"
    return rows


def spread(values: pd.Series, digits: int) -> str:
    """mean ± std over seeds, or the one value, as the report prints them, without the report's "(n=...)"."""
    return cell_text(values, digits).split(" (n=")[0]


def expected_cells(rows: pd.DataFrame, label: str) -> tuple[str, list[str]]:
    """The table row `label`'s ppl at L and its ratios at 2L, 8L, 16L."""
    name = re.split(r"[ (]", label)[0]  # "fire (threshold ...)" -> fire
    # a variant's rows carry its name (fox+rope); "rope+yarn" is the rope rows scored with that RoPE extension
    scheme, _, scaling = (name, "", "") if name in set(rows["position"]) else name.partition("+")
    mine = rows[(rows["mode"] == "nonoverlapping") & (rows["train_len"] == L) & (rows["position"] == scheme)
                & (rows["attention"].fillna("full") == "full")]  # the tables quote full attention
    plain = mine[mine["rope_scaling"].isna()].pivot_table(index="seed", columns="eval_len", values="ppl")
    scored = plain if not scaling else mine[mine["rope_scaling"] == scaling].pivot_table(
        index="seed", columns="eval_len", values="ppl")
    at_L = plain[L]
    ppl = cell_text(at_L, 2)  # mean ± std (n=...), or the one value
    if len(at_L.dropna()) == 1:  # every row says how many seeds it has, one included
        ppl += " (n=1)"
    return ppl, [spread(scored[k * L] / at_L, 3) for k in MULTIPLIERS]


def table_lines(lines: list[str], header: str) -> range:
    """The indices of the body lines of the markdown table whose header line starts with `header`."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return range(start, end)


def cells_of(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def corrected(rows: pd.DataFrame, cells: list[str]) -> list[str]:
    ppl, ratios = expected_cells(rows, cells[0])
    return [cells[0], cells[1] if cells[1] == "(rope's)" else ppl, *ratios, *cells[5:]]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="rewrite the cells that differ")
    args = parser.parse_args(argv)
    rows, differ = load_rows(), 0
    for readme, header in TABLES:
        path = ROOT / readme
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        for i in table_lines(lines, header):
            cells = cells_of(lines[i])
            new = corrected(rows, cells)
            if new != cells:
                differ += 1
                print(f"{readme}: {cells[0]}: {cells[1:5]} -> {new[1:5]}")
                lines[i] = "|" + "|".join(f" {c} " if c else " " for c in new) + "|\n"
        if args.write:
            path.write_text("".join(lines), encoding="utf-8")
    if not differ:
        print("the READMEs' tables match results/cpu-wt2/extrapolation.csv")
    return 1 if differ and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
