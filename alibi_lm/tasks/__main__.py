"""python -m alibi_lm.tasks: the registered synthetic tasks, comma-separated (the Makefile's TASKS)."""

from . import TASKS

print(",".join(name for name, task in TASKS.items() if task.synthetic))
