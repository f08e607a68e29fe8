"""The shared Private Evolution loop and its parts (docs/architecture.md, "Seams").

:mod:`.loop` (the loop and the three-verb strategy interface), :mod:`.pool` (candidates),
:mod:`.parts` (noisy quota, reference set, selection with variation, trim to quota, lookahead),
:mod:`.operators` (generators, embedder and the PE operators), :mod:`.selection`,
:mod:`.textgen` and :mod:`.prompts`. The vote kernels are :mod:`dpsynth.voting`, below the
compute engine that runs them.
"""
