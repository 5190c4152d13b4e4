"""make tasks: the synthetic task suite -> results/tasks/ (alibi_lm/plans/task_suite.py)."""

from alibi_lm.plans.task_suite import main

if __name__ == "__main__":
    main()
