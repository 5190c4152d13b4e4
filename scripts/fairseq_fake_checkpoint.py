"""A fake fairseq checkpoint of the released models' shape, to time the imported model's evaluation on a
machine without the real files (docs/paper-checkpoints.md).

    python scripts/fairseq_fake_checkpoint.py --template ../shared/fixtures/fairseq-alibi/alibi-h4/checkpoint.pt \
        --out /tmp/fake-wt103 [--L 512]

Writes <out>/alibi_fake_L<L>.pt (random float16 weights in the fairseq layout: 16 layers, d 1024, 8 heads,
FFN 4096, adaptive cutoffs 20000,60000, tied; the template fixture gives the cfg's other values) and a data
folder <out>/data/wikitext-103/ whose vocabulary has WikiText-103's size: WikiText-2's training split plus
one filler line of 234,464 words seen once (so the fairseq dictionary has 267,744 ids, as the released
models' has), and WikiText-2's valid/test splits, which are WikiText-103's articles. Its dict.txt is then
`python -m alibi_lm.fairseq_import dict <out>/data/wikitext-103/wiki.train.tokens --out <out>/dict.txt`.
Only the shapes and the token stream's length are real: the perplexities mean nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from alibi_lm.errors import ArgumentParser

SHAPE = dict(decoder_layers=16, decoder_embed_dim=1024, decoder_attention_heads=8, decoder_ffn_embed_dim=4096)
CUTOFFS = (20000, 60000)
VOCAB = 267_744  # the released models' fairseq dictionary (4 specials + WikiText-103's types, padded)


def fake_data(out: Path, wikitext2: Path) -> None:
    folder = out / "data" / "wikitext-103"
    folder.mkdir(parents=True, exist_ok=True)
    train = (wikitext2 / "wiki.train.tokens").read_text(encoding="utf-8")
    n_types = len({w for line in train.splitlines() for w in line.split()} - {"<unk>"})
    filler = " ".join(f"filler{i:06d}" for i in range(VOCAB - 4 - n_types))  # each once: the rarest band
    (folder / "wiki.train.tokens").write_text(train + f" {filler} \n", encoding="utf-8")
    for split in ("valid", "test"):
        shutil.copy(wikitext2 / f"wiki.{split}.tokens", folder / f"wiki.{split}.tokens")


def fake_weights(d: int, d_ff: int, layers: int) -> dict[str, torch.Tensor]:
    """fairseq transformer_lm state dict, float16, tied tensors sharing storage as fairseq saves them."""
    g = torch.Generator().manual_seed(0)

    def rand(*shape, std=0.02):
        return (torch.randn(*shape, generator=g) * std).half()

    edges = [0, *CUTOFFS, VOCAB]
    sd = {}
    for i, (lo, hi) in enumerate(zip(edges, edges[1:])):
        dim = d // 4**i
        sd[f"decoder.embed_tokens.embeddings.{i}.0.weight"] = rand(hi - lo, dim, std=dim**-0.5)
        sd[f"decoder.embed_tokens.embeddings.{i}.1.weight"] = rand(d, dim, std=dim**-0.5)
    for n in range(layers):
        p = f"decoder.layers.{n}."
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            sd[p + f"self_attn.{name}.weight"], sd[p + f"self_attn.{name}.bias"] = rand(d, d), rand(d)
        for name in ("self_attn_layer_norm", "final_layer_norm"):
            sd[p + f"{name}.weight"], sd[p + f"{name}.bias"] = torch.ones(d).half(), rand(d)
        sd[p + "fc1.weight"], sd[p + "fc1.bias"] = rand(d_ff, d), rand(d_ff)
        sd[p + "fc2.weight"], sd[p + "fc2.bias"] = rand(d, d_ff), rand(d)
    sd["decoder.adaptive_softmax.head.word_proj.weight"] = sd["decoder.embed_tokens.embeddings.0.0.weight"]
    sd["decoder.adaptive_softmax.head.class_proj.weight"] = rand(len(CUTOFFS), d)
    for i in range(len(CUTOFFS)):
        sd[f"decoder.adaptive_softmax.tail.{i}.0.weight"] = sd[f"decoder.embed_tokens.embeddings.{i + 1}.1.weight"]
        sd[f"decoder.adaptive_softmax.tail.{i}.2.weight"] = sd[f"decoder.embed_tokens.embeddings.{i + 1}.0.weight"]
    return sd


def main() -> None:
    parser = ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", type=Path, required=True, help="a fixture checkpoint: its cfg is reused")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--L", type=int, default=512, help="the training length the cfg records")
    parser.add_argument("--wikitext2", type=Path, default=Path("../shared/data/wikitext-2"))
    a = parser.parse_args()
    fake_data(a.out, a.wikitext2)
    state = torch.load(a.template, map_location="cpu", weights_only=True)
    cutoffs = ",".join(map(str, CUTOFFS))
    state["cfg"]["model"].update(SHAPE, decoder_input_dim=1024, decoder_output_dim=1024, tokens_per_sample=a.L,
                                 max_target_positions=a.L, adaptive_input_cutoff=cutoffs, adaptive_softmax_cutoff=cutoffs)
    state["cfg"]["task"]["tokens_per_sample"] = a.L
    state["model"] = fake_weights(1024, 4096, 16)
    for key in ("last_optimizer_state", "optimizer_history"):
        state.pop(key, None)
    path = a.out / f"alibi_fake_L{a.L}.pt"
    torch.save(state, path)
    n = sum(v.numel() for k, v in state["model"].items() if "adaptive_softmax" not in k)
    print(f"{path}: {n / 1e6:.1f}M parameters (tied softmax counted once)")


if __name__ == "__main__":
    main()
