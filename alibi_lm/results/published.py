"""Published extrapolation numbers to set our ratios beside (ppl at kL / ppl at L, per scheme).

Press et al. 2022, WikiText-103 validation: Table 3 (L = 1024, nonoverlapping; its columns closest to
2L, 8L, 16L are 2024, 8024, 16024) and Tables 13-15 (L = 512, sliding window, stride 1). Chi et al.
2022 (KERPLE), 162M GPT-NeoX on OpenWebText2, L = 512, nonoverlapping, at exactly kL. T5 ran out of
memory at 16L in the paper.
"""

from __future__ import annotations

# scheme -> {Lv: ppl}; our scheme names (the paper's "Rotary" is rope)
PRESS_TABLE3 = {  # L = 1024, nonoverlapping
    "sinusoidal": {1024: 19.34, 2024: 51.09, 8024: 284.88, 16024: 453.32},
    "rope": {1024: 19.33, 2024: 31.17, 8024: 64.91, 16024: 106.99},
    "t5": {1024: 18.80, 2024: 18.34, 8024: 25.79},
    "alibi": {1024: 18.66, 2024: 18.05, 8024: 17.96, 16024: 17.98},
}
PRESS_SLIDING = {  # L = 512, sliding window, stride 1
    "sinusoidal": {512: 18.35, 1024: 204.42, 2048: 306.19},
    "t5": {512: 17.92, 1024: 18.51, 2048: 22.62},
    "alibi": {512: 17.98, 1024: 17.92, 2048: 18.28},
}
KERPLE_SMALL = {  # L = 512, nonoverlapping
    "alibi": {512: 23.9, 1024: 22.4, 2048: 22.5, 4096: 22.2, 8192: 22.3},
    "t5": {512: 23.7, 1024: 21.9, 2048: 21.7, 4096: 22.5, 8192: 25.5},
    "rope": {512: 24.2, 1024: 32.8, 2048: 62.4, 4096: 111, 8192: 185},
    "sinusoidal": {512: 33, 1024: 750, 2048: 5507, 4096: 14039, 8192: 22621},
}


def published_ratio(table: dict, scheme: str, k: int) -> tuple[float, float] | None:
    """(ppl at the column closest to k x L / ppl at L, that column's Lv / L), or None if not published."""
    if not (row := table.get(scheme)):
        return None
    L = min(row)
    lv = min(row, key=lambda c: abs(c / L - k))
    return (row[lv] / row[L], lv / L) if abs(lv / L - k) <= 0.25 * k else None  # no column near k x L: None
