"""Perplexity at evaluation lengths L..16L ("train short, test long") for the project's trained runs and for
any Hugging Face causal LM (run=hf:<folder>).

    python -m alibi_lm.eval run=runs/quick/alibi-L64-seed0 eval.multipliers=[1,2,4,8,16]   # app.py

app.py         the eval app (configs/eval.yaml): EvalJob -> Evaluation
evaluation.py  Evaluation: a Subject scored at every length, rows into results/<experiment>/ (evaluate_run)
scoring.py     the two protocols (nonoverlapping, sliding) over a token stream, and the lengths to score
tasks.py       a run trained on a synthetic task: accuracy at L..16L (tasks.csv); retrieval.py: attention on the
               copied token by distance (retrieval.csv)
The model under test (a trained run or run=hf:<folder>) is a Subject from alibi_lm/subjects/.
"""
