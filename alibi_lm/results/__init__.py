"""An experiment's results, shared by the evaluation (alibi_lm/eval/) and the probes (alibi_lm/probes/).

store.py      the keyed CSV tables (extrapolation.csv; the probes' CSVs use its reader and writer)
report.py     extrapolation.md and its figures; __main__.py: python -m alibi_lm.results results/<experiment>
markdown.py   the tables and mean ± std cells every report writes
learned.py    learned.csv: learned scalars (slopes, FIRE's threshold, ...) beside their initial values
task_store.py, task_report.py, task_findings.py: a synthetic-task suite's tasks.csv and tasks.md
retrieval.py  retrieval.csv: each head's attention on the copied token by distance, and its reach
plots.py      the figures, and each scheme's colour and line style in every plot
findings.py   Press et al.'s findings checked on the rows; published.py the paper's numbers beside ours
"""
