"""python -m alibi_lm.results results/<experiment> [...]: rebuild each experiment's report (make report)."""

from .report import main

main()
