"""make bench: the speed / memory / MFU benchmark (the code: alibi_lm/bench/; also python -m alibi_lm.bench)."""

from alibi_lm.bench.cli import main

if __name__ == "__main__":
    main()
