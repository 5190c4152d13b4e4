"""make figures: the position schemes' slopes, biases and T5 buckets (alibi_lm/plans/scheme_figures.py)."""

from alibi_lm.plans.scheme_figures import main

if __name__ == "__main__":
    main()
