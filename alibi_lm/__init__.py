"""alibi-lm: train short, test long. Position schemes, a decoder LM, training and extrapolation."""

from . import provenance  # noqa: F401  (reads the git commit now: the code this process runs)

__version__ = "0.1.0"
