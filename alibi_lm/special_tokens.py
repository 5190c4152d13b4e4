"""The project's special tokens, shared by its tokenizers (data.py) and the fairseq dictionary
(fairseq_format/dictionary.py): one end-of-line token after every line, and the unknown word of a word vocabulary."""

EOS, UNK = "<eos>", "<unk>"
