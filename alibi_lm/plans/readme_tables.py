"""The perplexity tables that README.md (its headline rows) and results/cpu-wt2/README.md (every scheme) quote,
recomputed from results/cpu-wt2/extrapolation.csv: ppl at L = 128 over seeds, and ppl(kL) / ppl(L) per seed, then
mean ± std, for k = 2, 8, 16 (nonoverlapping, full attention; "rope+yarn" rows: the rope runs scored with that extension,
against rope's ppl at L); and the findings table that results/cpu-wt2/README.md copies from the generated
extrapolation.md. tests/test_readme_tables.py checks the READMEs against both.

    .venv/bin/python scripts/readme_tables.py           # list the cells that differ from the rows (exit 1 if any)
    .venv/bin/python scripts/readme_tables.py --write   # rewrite those cells in both READMEs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from alibi_lm.errors import ArgumentParser
from alibi_lm.results.markdown import cell_text

from . import checkout_root

ROOT = checkout_root()  # results/, runs/
L, MULTIPLIERS = 128, (2, 8, 16)
TABLES = (  # (README, the first characters of its table's header line)
    ("README.md", "| scheme | ppl at L | 2L | 8L | 16L |"),
    ("results/cpu-wt2/README.md", "| scheme | ppl at L | ours 2L |"),
)

COPIED = (  # (README, the generated report it copies a table from, the first characters of that table's header)
    ("results/cpu-wt2/README.md", "results/cpu-wt2/extrapolation.md", "| finding | criterion |"),
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


def copied_table(lines: list[str], header: str) -> tuple[int, int]:
    """[start, end) of the markdown table whose header line starts with `header`, header and separator included."""
    body = table_lines(lines, header)
    return body.start - 2, body.stop


def sync_copied(readme: str, report: str, header: str, write: bool) -> bool:
    """Whether `readme`'s copy of `report`'s table differs from it; with `write`, replace the copy."""
    path = ROOT / readme
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    source = (ROOT / report).read_text(encoding="utf-8").splitlines(keepends=True)
    start, end = copied_table(lines, header)
    first, last = copied_table(source, header)
    if lines[start:end] == source[first:last]:
        return False
    print(f"{readme}: its copy of {report}'s table \"{header}\" differs")
    if write:
        path.write_text("".join(lines[:start] + source[first:last] + lines[end:]), encoding="utf-8")
    return True


def main(argv=None) -> int:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    differ += sum(sync_copied(*copied, write=args.write) for copied in COPIED)
    if not differ:
        print("the READMEs' tables match results/cpu-wt2/extrapolation.csv and extrapolation.md")
    return 1 if differ and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
