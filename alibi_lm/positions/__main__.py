"""`python -m alibi_lm.positions`: the registered schemes, comma-separated (the Makefile's sweep list)."""

from . import POSITION_SCHEMES

print(",".join(POSITION_SCHEMES))
