"""DP-SynRAG: a differentially private synthetic knowledge base for RAG (docs/methods.md §4).

One module per step: :mod:`.keywords` (K keywords per document from a public vocabulary),
:mod:`.clusters` (noisy keyword histogram, soft clustering), :mod:`.retrieval` (noisy centre,
exponential-mechanism threshold), :mod:`.private_prediction` (clipped-logit aggregation over a
cluster, one forward pass per token; optional public-token shortcut), :mod:`.filtering`
(self-filtering), :mod:`.accounting` (Theorem 1, calibration of c), :mod:`.build`
(``build_kb``: the method :mod:`dpsynth.methods.synrag` through the runner) and :mod:`.index` /
:mod:`.answer` / :mod:`.service` (RAG over the released KB). The paper's baselines (RAG without
DP, no RAG, DP-Synth, Aug-PE KB, query-time DP-RAG) are research code in
``benchmarks/rag_baselines.py``.

    from dpsynth.rag.build import build_kb
    from dpsynth.rag.answer import answer
    run = build_kb("examples/tiny-synrag.yaml", "runs/tiny-synrag")
    answer("Which disease causes ...?", run, k=3)
"""
