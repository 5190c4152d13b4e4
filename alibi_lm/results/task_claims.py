"""Published results on the suite's tasks beside what its rows say on the same question: tasks.md's section
"Published results beside these rows", after the findings.

Each Claim states a published result (with its source, and how firmly it was read: Zoology's and Ruoss et al.'s are
their abstracts and figures, not per-task tables), the suite's tasks it speaks to, a measure that answers the same
question from one task's rows, and why this setting may differ. A measure gives what the rows say (exact match over
the seeds that learned the task at L, as the findings: task_findings.py) and whether it points the same way: True,
False, or None when the rows cannot decide (a scheme missing, fewer than MIN_SEEDS learned seeds, intervals that
overlap). The reason is shown only where the rows point the other way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from ..tasks.stream import LEARNED_AT
from .store import scheme_order
from .task_findings import MIN_SEEDS, MULTIPLES, Stats, cell_stats, seed_sets, stats_text, task_metric, verdict
from .task_learning import EFFECTIVE_SHARE

PAST_L = 2  # Kazemnejad et al. test up to twice the training length (n = 21..40 after n <= 20): their "past L"
NEAR_ZERO = 0.05  # "at 0": a 95% interval wholly at or below this
LEARNED = "learned seeds"
Measure = Callable[[pd.DataFrame, int, str], tuple[str, "bool | None"]]  # (main rows, L, metric) -> (said, same?)


@dataclass(frozen=True)
class Claim:
    source: str  # who, where, and how it was read
    text: str  # the result as the source states it
    tasks: tuple[str, ...] | None  # the suite's tasks it speaks to (None: every task)
    measure: Measure
    differs: str  # why this setting may differ, shown only where the rows point the other way


def learned_at(main: pd.DataFrame, L: int, labels, k: int, metric: str) -> dict[str, Stats]:
    """The schemes of `labels` scored at kL (a row with a value: a learned table of L positions is not applicable
    past L, and no scheme to compare): `metric` there over the seeds that learned the task at L."""
    scored = (main["eval_len"] == k * L) & main[metric].notna()
    seeds, present = seed_sets(main, L, learned_only=True), set(main.loc[scored, "label"])
    return {label: cell_stats(main, label, k * L, seeds.get(label, set()), metric) for label in labels
            if label in present}


def missing(main: pd.DataFrame, labels) -> str:
    """'no rows of rope, sinusoidal here' for the schemes of `labels` without rows."""
    absent = [label for label in labels if label not in set(main["label"])]
    return f"no rows of {', '.join(absent)} here" if absent else ""


def listing(stats: dict[str, Stats], labels=None) -> str:
    """'nope 0.89 [0.24, 1.00] (n=2), t5 1.00 [0.99, 1.00] (n=2), no learned seeds: rope, sinusoidal' for `labels`
    (all of `stats` by default)."""
    labels = list(stats if labels is None else labels)
    none = [label for label in labels if not stats[label][3]]
    return ", ".join([*(f"{label} {stats_text(stats[label])}" for label in labels if stats[label][3]),
                      *([f"no learned seeds: {', '.join(none)}"] if none else [])])


def pairs_text(pairs: list[tuple[str, str, str]], named: int = 4) -> str:
    """'above: t5 vs rope; within: nope vs rope; no verdict: 6 of 8' from (first, second, verdict) triples: the
    pairs of a verdict named, or counted where more than `named` share one that decides nothing."""
    grouped: dict[str, list[str]] = {}
    for first, second, said in pairs:
        grouped.setdefault(said if said in ("above", "below", "within") else "no verdict", []).append(
            f"{first} vs {second}")
    return "; ".join(f"{said}: {', '.join(names)}" if said in ("above", "below") or len(names) <= named
                     else f"{said}: {len(names)} of {len(pairs)}" for said, names in grouped.items())


def all_above(verdicts: list[str]) -> bool | None:
    """True where every verdict is 'above' (a pair whose intervals overlap, or without learned seeds, decides
    nothing, so one such pair leaves the claim undecided), False where one is 'below', else None."""
    if "below" in verdicts:
        return False
    return True if verdicts and all(v == "above" for v in verdicts) else None


def above_rope_and_ape(main: pd.DataFrame, L: int, metric: str) -> tuple[str, bool | None]:
    """At 2L over the learned seeds: NoPE, T5 and ALiBi each against RoPE and sinusoidal APE (all_above)."""
    good, bad = ("nope", "t5", "alibi"), ("rope", "sinusoidal")
    stats = learned_at(main, L, good + bad, PAST_L, metric)
    pairs = [(g, b, verdict(stats[g], stats[b], LEARNED)) for g in good for b in bad if g in stats and b in stats]
    if not pairs:
        return missing(main, good + bad), None
    said = f"at {PAST_L}L over the learned seeds: {listing(stats)}; {pairs_text(pairs)}"
    return said, all_above([v for *_, v in pairs])


def every_scheme_near_zero(main: pd.DataFrame, L: int, metric: str) -> tuple[str, bool | None]:
    """At 2L over the learned seeds: not the same direction where a scheme's interval lies wholly above NEAR_ZERO,
    the same where every decided one lies wholly at or below it."""
    stats = learned_at(main, L, scheme_order(main["label"].unique()), PAST_L, metric)
    decided = {label: s for label, s in stats.items() if s[3] >= MIN_SEEDS}
    clear = [label for label, s in decided.items() if s[1] > NEAR_ZERO]
    near = [label for label, s in decided.items() if s[2] <= NEAR_ZERO]
    if not stats:
        return f"no rows at {PAST_L}L here", None
    kinds = {f"interval wholly above {NEAR_ZERO}": clear, "wholly at or below it": near,
             "overlapping it": [label for label in decided if label not in clear + near]}
    rest = [label for label in stats if label not in decided]  # fewer than MIN_SEEDS learned seeds
    said = f"at {PAST_L}L over the learned seeds, " + "; ".join(
        [*(f"{kind}: {listing(stats, labels)}" for kind, labels in kinds.items() if labels),
         *([f"fewer than {MIN_SEEDS} learned seeds: {listing(stats, rest)}"] if rest else [])])
    return said, False if clear else (True if decided and len(near) == len(decided) else None)


def falls(at_L: Stats, past: Stats) -> tuple[bool | None, str]:
    """Whether a scheme's interval past L lies wholly below EFFECTIVE_SHARE of its mean at L (True), wholly at or
    above it (False) or across it (None), and the words for it."""
    floor, share = EFFECTIVE_SHARE * at_L[0], f"{EFFECTIVE_SHARE:.0%} of its value at L"
    if min(at_L[3], past[3]) < MIN_SEEDS:
        return None, f"fewer than {MIN_SEEDS} learned seeds"
    if past[2] < floor:
        return True, f"wholly below {share}"
    return (False, f"wholly at or above {share}") if past[1] >= floor else (None, f"across {share}")


def collapses(schemes: tuple[str, ...], k: int) -> Measure:
    """A measure: each of `schemes` falls past L, its interval at kL wholly below EFFECTIVE_SHARE of its mean at L
    (the relative effective length's criterion, task_learning.py), over the learned seeds; it holds where the
    interval lies wholly at or above that."""
    def measure(main: pd.DataFrame, L: int, metric: str) -> tuple[str, bool | None]:
        seeds, parts, verdicts = seed_sets(main, L, learned_only=True), [], []
        for label in [s for s in schemes if s in set(main["label"])]:
            at_L, past = (cell_stats(main, label, m * L, seeds.get(label, set()), metric) for m in (1, k))
            fell, word = falls(at_L, past)
            verdicts.append(fell)
            parts.append(f"{label} {stats_text(at_L)} at L, {stats_text(past, LEARNED)} at {k}L: {word}"
                         if at_L[3] else f"{label}: no learned seeds")
        decided = [v for v in verdicts if v is not None]
        return "; ".join(parts) or missing(main, schemes), (all(decided) if decided else None)
    return measure


def nope_or_t5_on_top(main: pd.DataFrame, L: int, metric: str) -> tuple[str, bool | None]:
    """At 2L: the better of NoPE and T5 (by mean, with MIN_SEEDS learned seeds) against ALiBi, RoPE and APE. Same
    direction where it lies wholly above each of them (the best of them all); not where one lies wholly above it;
    undecided where an interval overlaps its own."""
    stats = learned_at(main, L, ("nope", "t5", "alibi", "rope", "sinusoidal"), PAST_L, metric)
    tops = {label: stats[label] for label in ("nope", "t5") if label in stats and stats[label][3] >= MIN_SEEDS}
    if not tops:
        listed = listing(stats, [label for label in ("nope", "t5") if label in stats])
        return (f"at {PAST_L}L over the learned seeds: {listed}" if listed else missing(main, ("nope", "t5"))), None
    best = max(tops, key=lambda label: tops[label][0])
    pairs = [(best, label, verdict(tops[best], s, LEARNED)) for label, s in stats.items() if label not in ("nope", "t5")]
    said = f"at {PAST_L}L over the learned seeds: {best} {stats_text(tops[best])}" + (
        f", against {listing(stats, [label for _, label, _ in pairs])}; {pairs_text(pairs)}" if pairs
        else f"; {missing(main, ('alibi', 'rope', 'sinusoidal'))}")
    return said, all_above([v for *_, v in pairs])


def randomized_raise(main: pd.DataFrame, L: int, metric: str) -> tuple[str, bool | None]:
    """Each +random scheme against its sequential self at 4L and 16L: the count of 'above' against 'below' verdicts
    over the learned seeds decides (Ruoss et al.'s claim is an average); over all seeds is shown beside it."""
    labels = set(main["label"])
    pairs = [(label, label.removesuffix("+random")) for label in sorted(labels)
             if label.endswith("+random") and label.removesuffix("+random") in labels]
    lengths = [k for k in MULTIPLES if (main["eval_len"] == k * L).any()]
    if not pairs or not lengths:
        return "no scheme trained with randomized positions (and sequential ones) here", None
    texts, tally = [], {}
    for learned_only in (True, False):
        seeds, which = seed_sets(main, L, learned_only), LEARNED if learned_only else "seeds"
        over = "the learned seeds" if learned_only else "all seeds"
        said = [(f"{base}+random", f"{base} at {k}L", verdict(*(cell_stats(main, s, k * L, seeds.get(s, set()), metric)
                                                                 for s in (random, base)), which))
                for random, base in pairs for k in lengths]
        tally[learned_only] = [v for *_, v in said]
        texts.append(f"over {over}: {pairs_text(said)}")
    above, below = tally[True].count("above"), tally[True].count("below")
    return "; ".join(texts), (None if above == below else above > below)


def attention_learns_mqar(main: pd.DataFrame, L: int, metric: str) -> tuple[str, bool | None]:
    """Whether any scheme's seeds learn MQAR at L: same direction where one has MIN_SEEDS learned seeds, not where
    every scheme with MIN_SEEDS seeds has none."""
    learned, every = seed_sets(main, L, learned_only=True), seed_sets(main, L, learned_only=False)
    counts = {label: len(learned.get(label, ())) for label in every}
    by_share: dict[str, list[str]] = {}
    for label in sorted(scheme_order(every), key=lambda label: -counts[label] / len(every[label])):
        by_share.setdefault(f"{counts[label]}/{len(every[label])}", []).append(label)
    said = (f"seeds that learned it at L (exact match ≥ {LEARNED_AT}: every query of a sequence right): "
            + "; ".join(f"{share}: {', '.join(labels)}" for share, labels in by_share.items()))
    tried = [label for label in every if len(every[label]) >= MIN_SEEDS]
    if any(n >= MIN_SEEDS for n in counts.values()):
        return said, True
    return said, (False if tried and not any(counts[label] for label in tried) else None)


KAZEMNEJAD = "Kazemnejad et al. 2023 (NeurIPS)"  # 3-seed means of greedy exact match, its result files
COPY_SHIFT = ("there the string itself grows past the trained lengths (n = 21..40 after n ≤ 20, random tokens with "
              "repeats, greedy decoding), here 16 distinct symbols stay put and only the filler before the question "
              "grows (distinct symbols as in Zhou et al.'s unique copy, teacher-forced exact match), so the copy is "
              "an induction chain a model can follow by content at any distance")
CLAIMS = [
    Claim(KAZEMNEJAD, "on copying random tokens (cmc), tested on n = 21..40 after n ≤ 20, exact match NoPE 0.31, "
          "T5's bias 0.42, ALiBi 0.33, RoPE 0.01, sinusoidal APE 0.03: NoPE, T5 and ALiBi well above RoPE and APE.",
          ("copy",), above_rope_and_ape,
          COPY_SHIFT + "; their RoPE rotates a quarter of each head's dimensions, here all of them"),
    Claim(KAZEMNEJAD, "per length on the same task (n = 21 / 26 / 31 / 40): NoPE .79/.69/.05/.00, T5 .80/.72/.46/.00, "
          "ALiBi .82/.71/.09/.00, RoPE .04/0/0/0, APE .54/0/0/0: every scheme at 0 by twice the training length.",
          ("copy",), every_scheme_near_zero, COPY_SHIFT),
    Claim(KAZEMNEJAD, "sinusoidal APE at 0.00-0.04 on every copy and reverse split past the training lengths: an "
          "absolute scheme collapses right past L.", ("copy",), collapses(("sinusoidal",), PAST_L),
          COPY_SHIFT + "; a model that copies by content needs no embedding of a position it never saw"),
    Claim(KAZEMNEJAD, "RoPE at 0.00-0.08 on every copy and reverse split (above 0 only at n = 21): RoPE collapses "
          "past L on copy-like tasks.", ("copy",), collapses(("rope",), PAST_L),
          COPY_SHIFT + "; their RoPE rotates a quarter of each head's dimensions, here all of them"),
    Claim(KAZEMNEJAD + " on copy; on the passkey an expectation drawn from it, not a published result",
          "ALiBi at .82 for n = 21, .71 at 26, .09 at 31 and .00 at 40 on copying random tokens: its recency bias "
          "serves a near source and fails as the distance to it grows.", ("copy", "passkey"), collapses(("alibi",), 16),
          "ALiBi's smallest slope (2^-8, whatever the number of heads) biases a token 16L = 1024 back by only -4, "
          "which the match of a unique symbol or key can outweigh; Kazemnejad's strings repeat tokens, so no such "
          "unique match is there"),
    Claim(KAZEMNEJAD + " on copy; on the passkey an expectation drawn from it, not a published result",
          "NoPE or T5's bias is the best of the five schemes past the training lengths on copy: repeating one token "
          "(rsc) 0.99 / 0.77, replacing one (rdc) 0.97 / 0.94, random tokens (cmc) 0.31 / 0.42, against ALiBi's 0.29, "
          "0.17, 0.33; on the doubled copy (cmc2x) ALiBi is best (0.57 against 0.43 and 0.52).",
          ("copy", "passkey"), nope_or_t5_on_top,
          "their models are 12-layer T5-base decoders (~107M parameters); in small models NoPE's order, read from the "
          "causal mask alone, holds over a finite range only (Wang et al. 2024), and T5's buckets give every pair "
          "beyond max_distance (128) one bias"),
    Claim("Ruoss et al. 2023 (ACL; the abstract: per-task, per-scheme values not read)",
          "over 6000 models on 15 algorithmic tasks, randomized positional encodings raise test accuracy by 12.0% on "
          "average.", None, randomized_raise,
          "their models are non-causal encoders (5 layers, d = 64 in their example) that read the answer from blank "
          "slots; here causal decoders, whose order also comes from the mask, trained with positions drawn up to "
          "M = 16L; their 12.0% is an average over 15 tasks and several schemes, which one task can go against"),
    Claim("Arora et al. 2023, Zoology (its README's figure, read second hand; numbers not verified)",
          "attention (NoPE with a short convolution) solves MQAR at small width, where gated-convolution and "
          "recurrent models need a width growing with the sequence length and the number of pairs; no position "
          "schemes are compared. Its MQAR models have 2 layers (with the convolution); here, without it, only ALiBi "
          "learned MQAR at 2 layers (results/tasks-probe-init-mqar/), so the rows below are of 4-layer models and "
          "answer the question at twice its depth.", ("mqar",), attention_learns_mqar,
          "Zoology's attention has a kernel-3 short convolution in every layer, the models here none; here the "
          "queries close the sequence, so the key-query distance grows with the length, where Zoology's mostly "
          "follow the pairs; and exact match needs every query of a sequence right"),
]


def scale_note(L: int) -> str:
    return f"the models here are small (2-4 layers, width 64-128) and trained for a few thousand steps at L = {L}"


def claim_item(claim: Claim, groups) -> list[str]:
    """One claim's markdown item: the claim, then per group of its tasks what the rows say and the verdict."""
    lines = []
    for (task, options, L), part in groups:
        if claim.tasks is not None and task not in claim.tasks:
            continue
        main, name = part[part["variant"] == ""], task + (f" ({options})" if options else "")
        said, same = claim.measure(main, int(L), task_metric(task)) if not main.empty else ("", None)
        verdict_text = {True: "Same direction.", None: "Not decided.",
                        False: f"Not the same direction; why it may differ: {claim.differs}; {scale_note(int(L))}."}
        lines.append(f"  - {name}, L = {int(L)}: {said or 'no rows here'}. {verdict_text[same]}")
    return [f"- **{claim.source}**: {claim.text}", *lines] if lines else []


def claim_lines(groups) -> list[str]:
    """tasks.md's section on the published results its tasks speak to (none: no section)."""
    items = [line for claim in CLAIMS for line in claim_item(claim, groups)]
    if not items:
        return []
    return ["## Published results beside these rows\n",
            "Each published result on a question these rows also answer, then per task what the rows say on it and "
            "whether they point the same way: exact match (answer-token accuracy for flip-flop) over the seeds that "
            f"learned the task at L (exact match ≥ {LEARNED_AT} at L), mean [95% interval: t over seeds and Wilson "
            "over the pooled trials, the wider] (n = seeds); a verdict between two schemes as in the findings "
            "(disjoint intervals). *Not decided*: a scheme missing, fewer than "
            f"{MIN_SEEDS} seeds that learned the task at L, or intervals that overlap. Where the rows point the other "
            "way, why this setting may differ. Claims and criteria: alibi_lm/results/task_claims.py (the Kazemnejad "
            "et al. numbers: 3-seed means of greedy exact match from the authors' results/classic.jsonl and "
            "sanity_check.jsonl).\n", *items, ""]


__all__ = ["CLAIMS", "Claim", "claim_lines", "collapses", "scale_note"]
