"""DP-SynRAG's private prediction (step 4) at speed: today's path against the default one, side
by side on the same cluster and the same token sequence.

* baseline: the stepper in float32, each token's z over the whole vocabulary (the output layer
  computed for all 49k tokens of every document row);
* previous: the torch stepper in ``logits_dtype`` (bf16 where the CPU has native bf16), z over
  the public candidate set (:mod:`dpsynth.methods.synrag.support`: the public model's top
  tokens from a one-row stepper without documents, plus the public vocabulary's tokens), the
  output layer computed for those rows only (the default before the OpenVINO stepper);
* default: the production path (:func:`dpsynth.methods.synrag.private_prediction.open_documents`)
  on the engine ``synrag.stepper: auto`` picks (:mod:`dpsynth.llm.ov_stepper` where OpenVINO
  runs the model), both steppers on it: each document prefilled alone and decoded
  ``stepper_rows`` at a time at the public width of ``max_doc_tokens`` (so no document's
  logits depend on another's; docs/methods.md §4, "Rows apart").

All follow one token sequence (drawn once by the baseline through the private mechanism, with
seeded noise), so they do the same forward passes; the rounds alternate which path runs first
and the fastest round of each is kept (the machine is shared). ``kl``: the mean over tokens
and documents of KL(p_float32 || p_default) of the model's next-token distribution on the
same prompts (``kl_max`` the largest), in a separate untimed pass.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def _kl(p_logits: np.ndarray, q_logits: np.ndarray) -> np.ndarray:
    """KL(softmax(p) || softmax(q)) per row, in float64."""
    p = np.asarray(p_logits, dtype=np.float64)
    q = np.asarray(q_logits, dtype=np.float64)
    lp = p - p.max(axis=1, keepdims=True)
    lp -= np.log(np.exp(lp).sum(axis=1, keepdims=True))
    lq = q - q.max(axis=1, keepdims=True)
    lq -= np.log(np.exp(lq).sum(axis=1, keepdims=True))
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def public_top_share(gen: Any, prompt: str, texts: list[str], names: list[str],
                     top: int) -> float:
    """The pitfall measured: share of the tokens spelling ``names[i]`` in ``texts[i]`` that are
    among the public model's top ``top`` tokens at their position, the text so far taken as
    the released prefix after the rephrase prompt without document."""
    from ..methods.synrag.support import top_tokens

    inside = total = 0
    for text, name in zip(texts, names, strict=True):
        pos = text.lower().find(name.lower())
        before = gen.encode(text[:pos].rstrip())
        span = gen.encode(text[:pos + len(name)])[len(before):]
        # the prompt, then the text before the name, prefilled in one pass (the stepper's row
        # is encode_prompt(prompt) + encode(text before), the tokens advanced one by one)
        opened = (gen.open_stepper([text[:pos].rstrip()], shared_prefix=prompt) if before
                  else gen.open_stepper([prompt]))
        with opened as pub:
            for tok in span:
                total += 1
                inside += int(tok in set(top_tokens(pub.logits()[0], top).tolist()))
                pub.advance(tok)
    return inside / total if total else float("nan")


def bench_private_prediction(model: str = "smollm2", docs: int = 16, tokens: int = 24,
                             clip: float = 0.3, rounds: int = 2, top: int = 64,
                             dtype: str = "auto", stepper: str = "auto",
                             max_doc_tokens: int = 384, stepper_rows: int | None = None
                             ) -> dict[str, Any]:
    """Tokens per second of one cluster's private prediction, baseline vs default (see the
    module docstring). ``stepper_rows`` None: all ``docs`` rows in one pass, as a build's
    default (``synrag.stepper_rows`` unset: k, a cluster's documents)."""
    stepper_rows = docs if stepper_rows is None else stepper_rows
    if docs < 1 or tokens < 1 or rounds < 1 or stepper_rows < 1:
        raise ValueError("docs, tokens, rounds and stepper_rows must be >= 1")
    from ..demo_corpus import demo_knowledge, make_demo_corpus
    from ..llm import load_generator
    from ..methods.synrag.config import DEFAULT_REPHRASE, choose_stepper, resolve_logits_dtype
    from ..methods.synrag.keywords import demo_terms
    from ..methods.synrag.private_prediction import clipped_sum, open_documents, prompt_parts
    from ..methods.synrag.support import (
        disease_token_share,
        make_support,
        support_logits,
        term_token_ids,
    )
    from ..privacy import Accountant, PrivacySession, make_noise_source

    gen = load_generator(model, engine="transformers")
    dtype = resolve_logits_dtype(dtype)
    corpus = make_demo_corpus(max(docs, 60), seed=0)
    texts = list(corpus["text"])[:docs]
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    rows = [d + suffix for d in texts]
    vocab_ids = term_token_ids(gen, demo_terms(0))
    support = make_support(gen, vocab_ids, None, top)
    session = PrivacySession(Path(tempfile.mkdtemp()), Accountant("zcdp"),
                             make_noise_source("seeded", 0))

    gen.set_logits_dtype(dtype)
    engine = choose_stepper(gen, stepper)  # exports and compiles (untimed)

    def on(engine_name: str, dt: str) -> None:
        gen.set_logits_dtype(dt)
        gen.set_stepper_engine(engine_name)

    on("transformers", "float32")
    seq: list[int] = []
    with gen.open_stepper(rows, shared_prefix=prefix) as st:  # the token sequence (untimed)
        for n in range(tokens):
            seq.append(int(session.private_token(f"seq{n}", clipped_sum(st.logits(), clip),
                                                 clip, 1.0)))
            if n + 1 < tokens:
                st.advance(seq[-1])

    def baseline(r: int) -> tuple[float, float]:
        on("transformers", "float32")
        t0 = time.perf_counter()
        with gen.open_stepper(rows, shared_prefix=prefix) as st:
            t1 = time.perf_counter()
            for n in range(tokens):
                session.private_token(f"a{r}/{n}", clipped_sum(st.logits(), clip), clip, 1.0)
                if n + 1 < tokens:
                    st.advance(seq[n])
        return t1 - t0, time.perf_counter() - t1

    def documents() -> Any:  # the production path's stepper over the documents
        return open_documents(gen, texts, prefix, suffix, max_doc_tokens, stepper_rows)[0]

    def restricted(engine_name: str, tag: str, production: bool) -> Any:
        def arm(r: int) -> tuple[float, float]:
            on(engine_name, dtype)
            t0 = time.perf_counter()
            with (documents() if production else gen.open_stepper(rows, shared_prefix=prefix)
                  ) as st, gen.open_stepper([prefix + suffix]) as pub:
                t1 = time.perf_counter()
                for n in range(tokens):
                    ids = support.at(pub.logits()[0])
                    session.private_token(f"{tag}{r}/{n}",
                                          clipped_sum(support_logits(st, ids), clip),
                                          clip, 1.0, support=ids)
                    if n + 1 < tokens:
                        st.advance(seq[n])
                        pub.advance(seq[n])
            return t1 - t0, time.perf_counter() - t1
        return arm

    arms = {"baseline": baseline, "previous": restricted("transformers", "b", False),
            "default": restricted(engine, "c", True)}
    on("transformers", dtype)
    with gen.open_stepper(rows[:1], shared_prefix=prefix):  # converts the bf16 copy (untimed)
        pass
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in arms}
    for r in range(rounds):
        order = list(arms.items())
        for name, fn in order if r % 2 == 0 else order[::-1]:
            times[name].append(fn(r))

    # KL of the default engine's next-token distribution to float32's, same prompts (untimed)
    kls: list[np.ndarray] = []
    sizes: list[int] = []
    on("transformers", "float32")
    reference = gen.open_stepper(rows, shared_prefix=prefix)
    on(engine, dtype)
    fast = documents()
    with gen.open_stepper([prefix + suffix]) as pub:
        for n in range(tokens):
            kls.append(_kl(reference.logits(), fast.logits()))
            sizes.append(int(support.at(pub.logits()[0]).size))
            if n + 1 < tokens:
                for st in (reference, fast):
                    st.advance(seq[n])
                pub.advance(seq[n])
    reference.close()
    fast.close()
    kl = np.concatenate(kls)

    know = demo_knowledge(0)
    with_name = corpus[[d.lower() in t.lower() for d, t in zip(corpus["disease"],
                                                               corpus["text"], strict=True)]]
    share = disease_token_share(gen, list(with_name["text"]), list(with_name["disease"]),
                                support.fixed)
    named = min(12, docs)  # documents naming their disease: as many as the bench's, to 12
    top_share = public_top_share(gen, prefix + suffix, list(with_name["text"])[:named],
                                 list(with_name["disease"])[:named], top)
    best = {k: min(v, key=sum) for k, v in times.items()}
    tps = {k: tokens / sum(v) for k, v in best.items()}
    return {
        "model": model, "documents": docs, "tokens": tokens, "rounds": rounds,
        "max_doc_tokens": max_doc_tokens, "stepper_rows": stepper_rows,
        "dtype": dtype, "stepper": engine, "support_top": top, "vocab_size": int(gen.vocab_size),
        "support_size_mean": float(np.mean(sizes)), "diseases": len(know),
        "tokens_per_second": tps["default"], "baseline_tokens_per_second": tps["baseline"],
        "speedup": tps["default"] / tps["baseline"],
        "previous_tokens_per_second": tps["previous"],
        "speedup_over_previous": tps["default"] / tps["previous"],
        "prefill_s": best["default"][0], "baseline_prefill_s": best["baseline"][0],
        "decode_s": best["default"][1], "baseline_decode_s": best["baseline"][1],
        "previous_prefill_s": best["previous"][0], "previous_decode_s": best["previous"][1],
        "kl": float(kl.mean()), "kl_max": float(kl.max()),
        "disease_token_share": share, "disease_token_share_top_only": top_share,
    }
