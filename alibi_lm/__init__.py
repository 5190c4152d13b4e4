"""alibi-lm: train short, test long. Position schemes, a decoder LM, training and extrapolation.

Importing the package (or alibi_lm.model) has no side effects: no git subprocess, no Hydra. The apps
read the git commit when they start (alibi_lm.cli.main, provenance.read_commit_at_start)."""

__version__ = "0.1.0"
