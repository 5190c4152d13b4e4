"""python -m alibi_lm.results results/<experiment> [...]: rebuild each experiment's report (make report):
extrapolation.md and its figures from extrapolation.csv (report.py), tasks.md from tasks.csv (task_report.py).
Without a folder: list the folders there are to report, the committed experiments' and the trials' beside their runs."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from ..checkpoint import is_run_dir
from ..cli import one_line_errors
from ..config import run_results_root
from ..errors import ArgumentParser, UserError
from ..probes import report as probe_tables  # noqa: F401 - registers passkey.csv's and context_use.csv's schemas
from . import learned_values, retrieval_store, task_store  # noqa: F401 - register their tables' schemas (tables.py)
from .report import build_report
from .store import CSV_NAME
from .tables import check_folder, check_tables
from .task_report import build_task_report

# every table the reports read (task_report.py, report.py): all checked before either writes a file, so that a damaged
# one read late (learned.csv, after the task plots) leaves no folder of new plots beside an old report
REPORTED_TABLES = (CSV_NAME, task_store.TASKS_CSV, task_store.OVER_TRAINING_CSV, retrieval_store.RETRIEVAL_CSV,
                   learned_values.LEARNED_CSV)


def report_folders(root: Path = Path(".")) -> tuple[list[Path], list[Path]]:
    """(the committed experiments' folders under results/, the trials' under runs/<name>/results/) that hold a
    table to report."""
    def holding(pattern: str) -> list[Path]:
        return sorted({p.parent.relative_to(root) for table in (CSV_NAME, "tasks.csv") for p in root.glob(f"{pattern}/{table}")})

    return holding("results/**"), holding("runs/*/results/*")


def list_folders() -> None:
    committed, trials = report_folders()
    lines = [f"  {p}" for p in committed] or ["  (none)"]
    lines += ["trials beside their runs:", *(f"  {p}" for p in trials)] if trials else []
    print("no folder given; `python -m alibi_lm.results <folder>` (make report EXPERIMENT=<name>) rebuilds one of these:\n"
          "committed experiments:\n" + "\n".join(lines))


def check_not_a_run(folder: Path) -> None:
    """A run folder given for its results folder: one line naming the folder its evaluation writes to."""
    if not is_run_dir(folder):
        return
    try:
        name = OmegaConf.select(OmegaConf.load(folder / "config.yaml"), "name")
    except Exception:  # a damaged config.yaml: the line still says which folder to pass
        name = None
    rows = run_results_root(folder) / str(name or "<experiment>")
    raise UserError(f"{folder} is a run folder, not a results folder: `python -m alibi_lm.eval run={folder}` writes "
                    f"its rows to {rows}/; pass that folder")


def check_not_the_runs(folder: Path) -> None:
    """A trial's folder of runs (runs/<name>/) given for its results folder, which lies inside it
    (runs/<name>/results/<name>/, configs/train.yaml's paths.results): one line naming the folder to pass."""
    inner = folder / "results" / folder.name
    holds = [name for name in (CSV_NAME, task_store.TASKS_CSV) if (inner / name).is_file()]
    if holds and not any((folder / name).is_file() for name in (CSV_NAME, task_store.TASKS_CSV)):
        raise UserError(f"{folder} holds the runs of {folder.name}; its rows ({', '.join(holds)}) are in {inner}/: "
                        f"pass that folder (make report EXPERIMENT={folder.name} finds it)")


def main(argv: list[str] | None = None) -> None:
    parser = ArgumentParser(prog="python -m alibi_lm.results", description=__doc__.splitlines()[0])
    parser.add_argument("results_dir", nargs="*", help="results/<experiment> folder(s) holding extrapolation.csv "
                                                       "(none: list them)")
    parser.add_argument("--no-per-position", action="store_true", help="skip the per-position loss plots")
    parser.add_argument("--print", action="store_true", help="print each extrapolation.md (make demo)")
    parser.add_argument("--check", action="store_true", help="check every results table of the folder(s) line by "
                        "line and list each problem; writes nothing (exit 2 when one is damaged)")
    parser.add_argument("--repair", action="store_true", help="--check, then move the damaged rows of each table to "
                        "<table>.damaged and rewrite it without them, after asking")
    parser.add_argument("--yes", action="store_true", help="--repair without asking")
    args = parser.parse_args(argv)
    if args.check or args.repair:
        if not args.results_dir:
            parser.error("--check and --repair need a results/<experiment> folder")
        with one_line_errors():
            statuses = [check_folder(Path(d), repair=args.repair, yes=args.yes) for d in args.results_dir]
        sys.exit(max(statuses))
    if not args.results_dir:
        return list_folders()
    with one_line_errors():
        for d in map(Path, args.results_dir):
            if not d.is_dir():
                raise UserError(f"no results folder {d}; `python -m alibi_lm.results` (make report) lists the folders "
                                f"there are, and an experiment's folder appears once it has been evaluated")
            check_not_a_run(d)
            check_not_the_runs(d)
            check_tables(d, REPORTED_TABLES)
            task_rows = (d / "tasks.csv").is_file()  # a synthetic-task suite (task_report.py)
            reports = []
            if task_rows:
                reports += build_task_report(d)
            if (d / CSV_NAME).is_file() or not task_rows:
                reports += build_report(d, per_position=not args.no_per_position)
            for path in reports:
                print(path)
            if args.print:
                print("\n" + "\n".join(p.read_text() for p in reports if p.suffix == ".md"))


if __name__ == "__main__":
    main()
