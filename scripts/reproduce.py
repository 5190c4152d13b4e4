"""make reproduce: the CPU reproduction -> results/cpu-wt2/ (alibi_lm/plans/reproduce.py)."""

from alibi_lm.plans.reproduce import main

if __name__ == "__main__":
    main()
