"""The tables README files copy from the generated reports, checked or rewritten (alibi_lm/plans/readme_tables.py)."""

import sys

from alibi_lm.plans.readme_tables import main

if __name__ == "__main__":
    sys.exit(main())
