"""The extension comparison: every training-free method on every trained scheme -> results/extension/
(alibi_lm/plans/extension/)."""

from alibi_lm.plans.extension import main

if __name__ == "__main__":
    main()
