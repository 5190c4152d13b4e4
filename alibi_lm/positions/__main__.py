"""`python -m alibi_lm.positions`: the registered schemes, comma-separated (the Makefile's sweep list)."""

from ..errors import ArgumentParser
from . import POSITION_SCHEMES

ArgumentParser(prog="python -m alibi_lm.positions",
               description="Print the registered position schemes, comma-separated, in the paper's order "
                           "(the Makefile's sweep list; train one with position=<name>).").parse_args()
print(",".join(POSITION_SCHEMES))
