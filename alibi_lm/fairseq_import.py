"""Import the paper's official checkpoints (fairseq transformer_lm with ALiBi) as alibi-lm run folders.

    python -m alibi_lm.fairseq_import alibi_wt103_L512.pt --dict dict.txt [--data wikitext103] [--out runs/fairseq/...]
    python -m alibi_lm.fairseq_import dict wiki.train.tokens --out dict.txt   # fairseq-preprocess's dictionary

The run folder (default runs/<name>/alibi-L<L>-seed<seed>/) is read by every app like a trained run:
    python -m alibi_lm.eval run=runs/fairseq/alibi-L512-seed1 eval.lengths=[512,3072] eval.multipliers=[]
Bad input (a file that is not a transformer_lm, a refused pickle, a dictionary that does not fit) is one line,
`error: ...`, exit status 2, and nothing written. alibi_lm/fairseq_format/ says what is mapped and how.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from .checkpoint import atomic_write_text
from .cli import one_line_errors
from .errors import ArgumentParser, UserError
from .fairseq_format.convert import build_import, check_replaceable, data_config, default_out, write_run_folder
from .fairseq_format.dictionary import EOS_WORD, build_entries, count_words, dictionary_text, read_text_lines


def convert_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m alibi_lm.fairseq_import",
                            description="fairseq transformer_lm checkpoint -> alibi-lm run folder")
    parser.add_argument("checkpoint", type=Path, help="the fairseq .pt file (e.g. alibi_wt103_L512.pt)")
    parser.add_argument("--dict", type=Path, required=True, help="its dict.txt (fairseq-preprocess --only-source)")
    parser.add_argument("--data", default="wikitext103", help="configs/data/<name>: the set it was trained on")
    parser.add_argument("--data-root", default=None, help="folder holding the data set (default: $ALIBI_LM_DATA, else ./data)")
    parser.add_argument("--cache", default=".cache/alibi-lm", help="tokenized-data cache (paths.cache)")
    parser.add_argument("--name", default="fairseq",
                        help="experiment name: the run folder's and its results' (<runs>/<name>/results/<name>/)")
    parser.add_argument("--runs", default="runs", help="runs root for the default --out")
    parser.add_argument("--out", type=Path, default=None, help="run folder (default: <runs>/<name>/alibi-L<L>-seed<seed>)")
    parser.add_argument("--force", action="store_true", help="replace an existing run folder")
    return parser


def dict_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog="python -m alibi_lm.fairseq_import dict",
                            description="fairseq-preprocess --only-source's dict.txt of a text file")
    parser.add_argument("text", type=Path, help="the training split, e.g. wiki.train.tokens")
    parser.add_argument("--out", type=Path, required=True, help="where to write dict.txt")
    parser.add_argument("--force", action="store_true", help="replace an existing file at --out")
    return parser


# The data layer's messages name the train and evaluate apps' config keys; here the same settings are these flags.
FLAG_OF_KEY = {"data.root=": "--data-root ", "paths.cache=": "--cache ", "data=": "--data "}


def in_flags(error: UserError) -> UserError:
    """The error, with each config key the importer sets through a flag (data.root=...) written as that flag."""
    keys = "|".join(re.escape(key) for key in FLAG_OF_KEY)
    pattern = re.compile(rf"(set )?(?<![\w.])({keys})")
    return type(error)(pattern.sub(lambda m: ("pass " if m.group(1) else "") + FLAG_OF_KEY[m.group(2)], str(error)))


def convert(argv: list[str]) -> Path:
    a = convert_parser().parse_args(argv)
    if a.out:
        check_replaceable(Path(a.out), a.force)  # before the conversion's work
    try:
        built = build_import(a.checkpoint, a.dict, data_config(a.data, a.data_root, a.cache), a.name)
    except UserError as e:
        raise in_flags(e) from None
    job = built["job"]
    job.paths.runs, job.paths.results = a.runs, str(Path(a.runs, job.name, "results"))  # its rows: beside its runs
    out = write_run_folder(a.out or default_out(a.runs, job), built, a.force)
    print(f"{a.checkpoint} -> {out} (L={job.train.seq_len}, {job.model.n_layer} layers, d={job.model.d_model}, "
          f"{job.model.n_head} heads, {job.model.vocab_size:,} ids, {built['source']['dtype']} stored as float32)")
    return out


def write_dict(argv: list[str]) -> Path:
    a = dict_parser().parse_args(argv)
    if a.out.is_dir():
        raise UserError(f"--out {a.out} is a folder; give the path of the file to write, e.g. --out {a.out / 'dict.txt'}")
    if a.out.exists() and not a.force:
        raise UserError(f"--out {a.out} exists and would be replaced; add --force to replace it, or give another --out")
    counts = count_words(read_text_lines(a.text))
    if not any(count for word, count in counts.items() if word != EOS_WORD):
        raise UserError(f"{a.text} holds no words: a dictionary of it would be padding alone; give the training split")
    entries = build_entries(counts)
    atomic_write_text(a.out, dictionary_text(entries))
    print(f"{a.text} -> {a.out} ({len(entries):,} lines, {len(entries) + 4:,} ids with the 4 specials)")
    return a.out


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    with one_line_errors():
        if argv[:1] == ["dict"]:
            write_dict(argv[1:])
        else:
            convert(argv)


if __name__ == "__main__":
    main()
