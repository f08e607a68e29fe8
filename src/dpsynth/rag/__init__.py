"""RAG over a DP synthetic knowledge base (docs/methods.md §4).

The build is the method :mod:`dpsynth.methods.synrag` (one module per DP-SynRAG step beside it:
keywords, clusters, retrieval, private prediction, filtering, accounting, config), run through
the one runner by :func:`dpsynth.api.build_kb`. This package serves a released KB and spends
nothing: :mod:`.index` (the faiss index of release/kb.jsonl), :mod:`.answer` (retrieve and
answer) and :mod:`.service` (the HTTP service). The paper's baselines (RAG without DP, no RAG,
DP-Synth, Aug-PE KB, query-time DP-RAG) are research code in ``benchmarks/rag_baselines.py``.

    from dpsynth.api import build_kb
    from dpsynth.rag.answer import answer
    run = build_kb("examples/tiny-synrag.yaml", "runs/tiny-synrag")
    answer("Which disease causes ...?", run, k=3)
"""
