"""The task suite's rerun check: committed runs trained again with 1 and 2 threads (alibi_lm/plans/task_rerun.py)."""

from alibi_lm.plans.task_rerun import main

if __name__ == "__main__":
    main()
