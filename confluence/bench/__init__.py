"""Benchmarks, each reached from `confluence bench ...`: `sources` (open / scan / draft per source kind),
`preprocess` (wall time and peak memory), `text_encoder` (strings/s), `sampler` (the training batch stream),
`train` (the fused train step on synthetic batches, `synthetic`; `profile`: the same step operation by operation),
`attention` (the block-sparse kernel)."""
