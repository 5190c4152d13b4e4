"""Speed, memory and model-FLOPs utilisation of every position scheme (make bench).

    python -m alibi_lm.bench                       # CPU: model=tiny, L = 128 and 512
    python -m alibi_lm.bench --device cuda         # GPU: model=small, L = 512 and 1024, bf16
    python -m alibi_lm.bench --quick --out /tmp/b  # a smoke run of every section (about a minute)

Writes <out>/<host>.csv and <out>/<host>.md (host: cpu-<N>core or cuda-<gpu name>):

1. training throughput (forward + backward + gradient clipping + optimizer step, as alibi_lm.train
   does) of every registered position scheme (alibi_lm.positions.POSITION_SCHEMES) at each L, and
   its ratio to nope;
2. ALiBi in alibi-lm against two peer implementations on the same batch, in the same process: a
   naive one (the full (B, H, T, T) bias built in every layer, softmax written out) and
   x-transformers (Decoder(alibi_pos_bias=True), no absolute embedding);
3. evaluation (score_stream, as alibi_lm.eval) at Lv = L, 2L, 4L, 8L, 16L: tokens/s, and peak
   memory: on CPU the peak RSS (VmHWM) of a fresh process per (scheme, Lv), on GPU
   torch.cuda.max_memory_allocated;
4. MFU: the FLOP/s of training (6N plus the attention term at the actual length) over the
   machine's measured peak (a large fp32 matmul on CPU, bf16 on GPU).

Ratios come from paired rounds (harness.py): every round times each model once, interleaved, and
a ratio is estimated from its per-round ratios, with a 95% interval (stats.py); rounds repeat until
every ratio's interval is within the tolerance (default +/-5%) or the round cap is hit.

Modules: cli (arguments, the run), options (its settings), common (configs, synthetic data, machine),
harness (paired rounds), stats (medians, ratios, intervals), rows (typed results), peers (naive,
x-transformers), flops (FLOP model, peak), training (sections 1, 2, 4), evaluation (section 3),
targets and report (CSV, markdown).
"""
