"""An experiment's results, shared by the evaluation (alibi_lm/eval/) and the probes (alibi_lm/probes/).

store.py      the keyed CSV tables (extrapolation.csv; the probes' CSVs use its reader and writer)
report.py     extrapolation.md and its figures (python -m alibi_lm.results results/<experiment>)
plots.py      the figures, and each scheme's colour and line style in every plot
findings.py   Press et al.'s findings checked on the rows; published.py the paper's numbers beside ours
"""
