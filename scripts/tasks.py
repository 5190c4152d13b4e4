"""make tasks: the synthetic task suite -> results/tasks/ (alibi_lm/plans/tasks.py)."""

from alibi_lm.plans.tasks import main

if __name__ == "__main__":
    main()
