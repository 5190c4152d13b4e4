"""Beyond perplexity: passkey retrieval and the context-use curve, for the project's trained runs
and for any Hugging Face causal LM (run=hf:<folder>, alibi_lm/subjects/hf.py).

    python -m alibi_lm.probes run=runs/quick/alibi-L64-seed0     # app.py, configs/probes.yaml
    python -m alibi_lm.probes sweep=quick                       # every run of an experiment, then the report

What a probe sees of a model (a trained run or a Hugging Face one) is a Subject (alibi_lm/subjects/);
its CSVs and figures are written with alibi_lm/results/ (store.py, plots.py).

passkey.py      prompts (key at a depth inside filler, exact length Lv) and teacher-forced scores
context_use.py  loss against tokens of context, log-spaced bins, the saturation context c*
report.py       the CSVs and probes.md; plots.py the heatmaps and curves
config.py       ProbesJob, the app's typed job (probes_schema in Hydra's ConfigStore)
"""

from . import config  # noqa: F401 - registers probes_schema, which configs/probes.yaml extends
