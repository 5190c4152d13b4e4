"""Import the paper's official checkpoints (fairseq `transformer_lm` with ALiBi) without fairseq.

dictionary.py  fairseq's dictionary: built from text as `fairseq-preprocess --only-source` does, read
               from a dict.txt, and as the word tokenizer of `tokenizer=fairseq` runs
checkpoint.py  a fairseq checkpoint read with the restricted unpickler, its architecture as an LMConfig
               and its weights as a TransformerLM state dict
convert.py     a checkpoint (+ its dict.txt) -> an ordinary alibi-lm run folder, written atomically

The command line is alibi_lm/fairseq_import.py.
"""
