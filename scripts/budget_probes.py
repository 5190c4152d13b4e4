"""make budget-probes: how the training budget changes the paper's effects (alibi_lm/plans/budget_probes.py)."""

from alibi_lm.plans.budget_probes import main

if __name__ == "__main__":
    main()
