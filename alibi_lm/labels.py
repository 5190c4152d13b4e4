"""How a number is written into a label (a rows' position or rope_scaling value, a run's name): as short as `:g`
writes it where that reads back as the very number, else in full, so that two settings never share a label and a
rerun with the other value never takes the first one's rows as its own (4.0000001 is not x4, 1000001 not 1e+06)."""

from __future__ import annotations


def label_number(value: float) -> str:
    short = f"{value:g}"
    if float(short) == value:
        return short
    return str(value) if isinstance(value, int) else repr(float(value))


# A run's name chosen by its settings, <experiment>-custom-<digest> (alibi_lm/naming.py): the digest of the settings
# that differ from the experiment's, so another budget is another name
CUSTOM_MARK = "-custom-"
