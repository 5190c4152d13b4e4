"""Training a model (the train app, alibi_lm/train.py, drives it).

trainer.py      Trainer: build, restore, step, validate, checkpoint, finish
streams.py      LMStream (language modelling) and is_synthetic; a synthetic task's stream is tasks/stream.py
distributed.py  torchrun / DDP setup and the generators' state a checkpoint keeps
reuse.py        whether a run folder may be resumed or reused (NOT_MODEL_KEYS, check_same_run)
"""
