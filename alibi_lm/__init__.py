"""alibi-lm: train short, test long. Position schemes, a decoder LM, training and extrapolation."""

__version__ = "0.1.0"
