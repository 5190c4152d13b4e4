"""fairseq's Dictionary, as `fairseq-preprocess --only-source` builds and saves it, without fairseq.

Ids: the four specials <s>=0, <pad>=1, </s>=2, <unk>=3 (not written in dict.txt), then the words by
count, descending; equal counts in the order of the words' code points (fairseq's finalize sorts the
(word, count) pairs by word, then Counter.most_common sorts stably by count). Every line of text
counts its whitespace-split words and one </s>; a literal <unk> in the text counts towards the special
<unk>, never as a word. The ids are padded with madeupword0000, madeupword0001, ... (count 0, written in
the file) to a multiple of 8.

In a `tokenizer=fairseq` run the end-of-line token </s> is the project's <eos> (alibi_lm.data.EOS) at id 2.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors

from ..errors import UserError
from ..special_tokens import EOS

BOS, PAD, EOS_WORD, UNK = "<s>", "<pad>", "</s>", "<unk>"
SPECIALS = (BOS, PAD, EOS_WORD, UNK)
EOS_ID, UNK_ID = 2, 3
PADDING_FACTOR = 8  # fairseq-preprocess's --padding-factor default


def count_words(lines: Iterable[str]) -> Counter:
    """word -> count over `lines` (fairseq's tokenize_line is a whitespace split), </s> once per line."""
    counts: Counter = Counter()
    n_lines = 0
    for line in lines:
        counts.update(line.split())
        n_lines += 1
    counts[EOS_WORD] += n_lines
    return counts


def build_entries(counts: Counter, padding_factor: int = PADDING_FACTOR) -> list[tuple[str, int]]:
    """The (word, count) lines of dict.txt (ids 4, 5, ...) for these counts."""
    words = sorted(((w, c) for w, c in counts.items() if w not in SPECIALS), key=lambda wc: (-wc[1], wc[0]))
    n_pad = -(len(SPECIALS) + len(words)) % padding_factor
    return words + [(f"madeupword{i:04d}", 0) for i in range(n_pad)]


def dictionary_text(entries: list[tuple[str, int]]) -> str:
    return "".join(f"{word} {count}\n" for word, count in entries)


def read_text_lines(path: Path) -> Iterable[str]:
    """The lines of a text file as fairseq reads them (UTF-8, universal newlines)."""
    try:
        with open(path, encoding="utf-8") as f:
            yield from f
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} as UTF-8 text ({type(e).__name__}); pass the training split, "
                        f"e.g. wiki.train.tokens") from None


def read_dictionary(path: Path) -> list[str]:
    """The words of a fairseq dict.txt, in id order from id 4 (the specials are not in the file)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read the fairseq dictionary {path} ({type(e).__name__}); pass --dict <the "
                        f"dict.txt that fairseq-preprocess wrote beside the binarized data>") from None
    words, previous = [], None
    for number, line in enumerate(lines, 1):
        word, _, count = line.rstrip().rpartition(" ")
        overwrite = count == "#fairseq:overwrite"  # a flag fairseq allows after the count
        if overwrite:
            word, _, count = word.rpartition(" ")
        if not word or not count.lstrip("-").isdigit():
            raise UserError(f"{path}:{number} is not a `word count` line of a fairseq dict.txt; pass the "
                            f"dict.txt that fairseq-preprocess wrote")
        if not overwrite and previous is not None and int(count) > previous:
            # fairseq-preprocess writes the words by falling count: a line moved maps ids to other words
            raise UserError(f"{path}:{number}: {word!r} counts {count} after a word counting {previous}; "
                            f"fairseq-preprocess writes the words by falling count, so this dict.txt was reordered "
                            f"and its ids would name other words: pass the dict.txt that fairseq-preprocess wrote")
        previous = previous if overwrite else int(count)
        words.append(word)
    if len(set(words)) != len(words) or set(words) & set(SPECIALS):
        raise UserError(f"{path} repeats a word or lists a special symbol; it is not a fairseq dict.txt")
    return words


def vocabulary(words: list[str]) -> list[str]:
    """Every id's string as a `tokenizer=fairseq` run's tokenizer holds it: </s> becomes the project's <eos>."""
    return [BOS, PAD, EOS, UNK, *words]


def fairseq_tokenizer(words: list[str]) -> Tokenizer:
    """A word-level tokenizer with fairseq's ids (vocabulary()): whitespace split, <unk> for unknown words,
    <eos> (id 2) after every line, as fairseq's binarizer encodes a line."""
    vocab = vocabulary(words)
    tokenizer = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([vocab[EOS_ID]])
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {vocab[EOS_ID]}",
                                                             special_tokens=[(vocab[EOS_ID], EOS_ID)])
    return tokenizer


def tokenizer_from_lines(lines: list[str]) -> Tokenizer:
    """tokenizer=fairseq (alibi_lm.data): the dictionary fairseq-preprocess builds from the training split."""
    return fairseq_tokenizer([w for w, _ in build_entries(count_words(lines))])


def tokenizer_words(tokenizer: Tokenizer) -> list[str]:
    """The dictionary words (ids 4, 5, ...) of a fairseq_tokenizer."""
    vocab = tokenizer.get_vocab()
    return sorted((w for w, i in vocab.items() if i >= len(SPECIALS)), key=vocab.get)
