"""The reference arm of bench_vs_pe.py: Microsoft's Private Evolution library (``pe``, github
microsoft/DPSDA) running its own Yelp text pipeline. Runs under pe's own Python, never the
project's: bench_vs_pe.py starts it as a subprocess with ``--pe-python``.

    PE_PYTHON -m pip install --no-deps DPSDA_CHECKOUT   # pe, in its own virtualenv
    PE_PYTHON benchmarks/pe_arm.py --out DIR --private dev.csv --limit 1000 --model SMOLLM2_DIR \
        --embedder MINILM_DIR --samples 200 --iterations 2 --pool-multiplier 3 ...

The pipeline is the structure of pe's example/text/yelp_huggingface/main.py with this
benchmark's sizes: its Yelp data class (label columns business_category and review_stars, the
"Business Category: " / "Review Stars: " prefixes stripped as pe does), LLMAugPE with the
example's own random and variation prompt files (read from the pe checkout given by
``--pe-source``), HuggingfaceLLM, the SentenceTransformer embedding, NearestNeighbors (mode L2,
no lookahead), the Gaussian DP of pe.dp, PEPopulation (rank selection, keep_selected, L - 1
variations initially and after each vote) and the PE runner.

What this file adds around pe, none of it changing what pe computes:

* stand-ins for pe's image subpackages (they import torchvision, whose PyPI build does not
  match the CPU torch; no image code runs) and for tiktoken's encoding (downloaded at run time
  by LLMAugPE for word blanking, which the Yelp example does not use);
* a FastChat conversation template for SmolLM2 (ChatML with the model's own default system
  turn, as its chat template renders a conversation without one): pe's documented way to run a
  model FastChat does not know;
* timers and counters around the LLM (generated tokens up to and including the stop token),
  the embedding, the histogram and the whole run;
* the label split (``--label-fractions``): ``public`` is pe's default (exact private label
  fractions, taken as public); ``noisy`` (the default here) is the honest setting pe has:
  ``fraction_per_label_id`` from Gaussian-noised label counts (sensitivity 1), with the noise
  multiplier pe's own accountant gives for T + 1 Gaussian mechanisms at (epsilon, delta); the
  votes then run with that multiplier (``noise_multiplier=``) and the epsilon reported is pe's
  ``compute_epsilon`` for T + 1 steps. Each label gets at least one sample (pe requires it).

Writes DIR/result.json (times, tokens, epsilon) and DIR/synthetic.jsonl, DIR/zero_shot.jsonl
(the N texts selected by the last vote; the N random-API texts of iteration 0), labels in the
test file's form.
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import os
import sys
import time
import types
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


class _Stub(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None


class _ImageStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Empty modules for ``pe.<...>.image`` (image code; needs torchvision)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        parts = name.split(".")
        if parts[0] == "pe" and "image" in parts[1:]:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:
        module = _Stub(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: Any) -> None:
        pass


class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.counts: dict[str, int] = {}

    def wrap(self, key: str, fn: Any) -> Any:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start
        return timed


def register_smollm2_template(fastchat_name: str) -> None:
    from fastchat.conversation import Conversation, SeparatorStyle, register_conv_template
    from fastchat.model.model_adapter import (
        BaseModelAdapter,
        get_conv_template,
        register_model_adapter,
    )

    system = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
              "Hugging Face")
    register_conv_template(Conversation(
        name=fastchat_name, system_template=system, roles=("<|im_start|>user",
                                                           "<|im_start|>assistant"),
        sep_style=SeparatorStyle.CHATML, sep="<|im_end|>", stop_token_ids=[2]))

    class SmolLM2Adapter(BaseModelAdapter):
        def match(self, model_path: str) -> bool:
            return "smollm2" in model_path.lower()

        def load_model(self, model_path: str, from_pretrained_kwargs: dict) -> Any:
            raise NotImplementedError

        def get_default_conv_template(self, model_path: str) -> Any:
            return get_conv_template(fastchat_name)

    register_model_adapter(SmolLM2Adapter)


def quota_at_least_one(total: int, weights: Any) -> Any:
    """Integer samples per label in proportion to ``weights`` (negatives -> 0), largest
    remainder, every label at least 1 (pe refuses a label with none)."""
    import numpy as np

    w = np.maximum(np.asarray(weights, dtype=np.float64), 0.0)
    n = len(w)
    if total < n:
        raise SystemExit(f"pe needs at least one sample per label: N = {total} < {n} labels")
    w = np.ones(n) if w.sum() <= 0 else w
    rest = total - n
    exact = rest * w / w.sum()
    parts = np.floor(exact).astype(np.int64)
    left = rest - int(parts.sum())
    parts[np.argsort(-(exact - parts), kind="stable")[:left]] += 1
    return parts + 1


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--private", required=True, help="yelp dev.csv")
    ap.add_argument("--limit", type=int, default=1000)
    ap.add_argument("--model", required=True, help="SmolLM2 float32 HF directory")
    ap.add_argument("--embedder", required=True, help="MiniLM sentence-transformers directory")
    ap.add_argument("--pe-source", required=True, help="the DPSDA checkout (example prompts)")
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--iterations", type=int, default=2)
    ap.add_argument("--pool-multiplier", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-p", type=float, default=None, help="None: transformers' default")
    ap.add_argument("--top-k", type=int, default=None, help="None: transformers' default (50)")
    ap.add_argument("--batch-size", type=int, default=128, help="pe's default: 128")
    ap.add_argument("--epsilon", type=float, default=4.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--label-fractions", choices=["noisy", "public"], default="noisy")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    t_all = time.perf_counter()

    sys.meta_path.insert(0, _ImageStubs())
    import tiktoken

    class _NoBlanking:
        def encode(self, text: str, **kw: Any) -> list[int]:
            return [0]

        def decode(self, ids: Any) -> str:
            raise RuntimeError("word blanking is not used in this benchmark")

    tiktoken.encoding_for_model = lambda _name: _NoBlanking()  # type: ignore[assignment]

    import numpy as np
    import pandas as pd
    import torch
    from pe.api.text import LLMAugPE
    from pe.constant.data import (
        LABEL_ID_COLUMN_NAME,
        TEXT_DATA_COLUMN_NAME,
        VARIATION_API_FOLD_ID_COLUMN_NAME,
    )
    from pe.data.text import Yelp
    from pe.dp import Gaussian
    from pe.dp.gaussian import compute_epsilon, get_noise_multiplier
    from pe.embedding.text import SentenceTransformer
    from pe.histogram import NearestNeighbors
    from pe.llm import HuggingfaceLLM
    from pe.logging import setup_logging
    from pe.population import PEPopulation
    from pe.runner import PE

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    import random
    random.seed(args.seed)
    setup_logging(log_file=str(out / "log.txt"))
    register_smollm2_template("dpsynth-bench-smollm2")

    # pe's Yelp class reads ROOT/val.csv and writes ROOT/val_processed.csv (private: 0600)
    data_dir = out / "private-data"
    data_dir.mkdir(exist_ok=True)
    raw = pd.read_csv(args.private, dtype=str, keep_default_na=False).head(args.limit)
    os.umask(0o077)  # the private copies pe reads and writes stay the owner's
    raw.to_csv(data_dir / "val.csv", index=False)
    (data_dir / "val_processed.csv").unlink(missing_ok=True)
    data = Yelp(root_dir=str(data_dir), split="val")

    timer = Timer()
    gen_args: dict[str, Any] = {"temperature": args.temperature}
    if args.top_p is not None:
        gen_args["top_p"] = args.top_p
    if args.top_k is not None:
        gen_args["top_k"] = args.top_k
    t0 = time.perf_counter()
    llm = HuggingfaceLLM(max_completion_tokens=args.max_new_tokens, model_name_or_path=args.model,
                         batch_size=args.batch_size, **gen_args)
    load_seconds = time.perf_counter() - t0
    tokens = {"generated": 0, "requests": 0}
    stops = set(llm._stop_token_ids)
    raw_generate = llm._model.generate

    def counted_generate(input_ids: Any, **kw: Any) -> Any:
        result = raw_generate(input_ids, **kw)
        for row in result[:, input_ids.shape[1]:].tolist():
            n = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
            tokens["generated"] += n
            tokens["requests"] += 1
        return result

    llm._model.generate = counted_generate
    llm.get_responses = timer.wrap("generation", llm.get_responses)
    example = Path(args.pe_source) / "example" / "text" / "yelp_huggingface"
    api = LLMAugPE(llm=llm, random_api_prompt_file=str(example / "random_api_prompt.json"),
                   variation_api_prompt_file=str(example / "variation_api_prompt.json"))
    zero_shot: list[str] = []
    raw_random = api.random_api

    def kept_random(label_info: Any, num_samples: int) -> Any:
        got = raw_random(label_info=label_info, num_samples=num_samples)
        zero_shot.extend(got.data_frame[TEXT_DATA_COLUMN_NAME].tolist())
        return got

    api.random_api = kept_random
    t0 = time.perf_counter()
    embedding = SentenceTransformer(model=args.embedder)
    load_seconds += time.perf_counter() - t0
    embedding.compute_embedding = timer.wrap("embedding", embedding.compute_embedding)
    histogram = NearestNeighbors(embedding=embedding, mode="L2", lookahead_degree=0)
    histogram.compute_histogram = timer.wrap("histogram", histogram.compute_histogram)
    dp = Gaussian()
    dp.add_noise = timer.wrap("noise", dp.add_noise)
    folds = args.pool_multiplier - 1
    population = PEPopulation(api=api, initial_variation_api_fold=folds,
                              next_variation_api_fold=folds, keep_selected=True,
                              selection_mode="rank")
    population.next = timer.wrap("population_next", population.next)

    steps = args.iterations
    fractions = None
    label_note = "exact private label fractions, treated as public (pe's default)"
    if args.label_fractions == "noisy":
        steps = args.iterations + 1
        sigma = get_noise_multiplier(epsilon=args.epsilon, num_steps=steps, delta=args.delta)
        counts = data.data_frame[LABEL_ID_COLUMN_NAME].value_counts().reindex(
            range(len(data.metadata.label_info)), fill_value=0).to_numpy(dtype=np.float64)
        noisy = counts + np.random.normal(scale=sigma, size=len(counts))
        fractions = quota_at_least_one(args.samples, noisy).tolist()
        label_note = ("fraction_per_label_id from Gaussian label counts (sigma = the votes' "
                      "noise multiplier; pe's accountant composes T + 1 steps), at least one "
                      "sample per label")
        run_kw: dict[str, Any] = {"noise_multiplier": sigma}
    else:
        sigma = get_noise_multiplier(epsilon=args.epsilon, num_steps=steps, delta=args.delta)
        run_kw = {"epsilon": args.epsilon}
    epsilon = compute_epsilon(noise_multiplier=sigma, num_steps=steps, delta=args.delta)

    runner = PE(priv_data=data, population=population, histogram=histogram, dp=dp,
                callbacks=[], loggers=[])
    t_run = time.perf_counter()
    syn = runner.run(num_samples_schedule=[args.samples] * (args.iterations + 1),
                     delta=args.delta, checkpoint_path=str(out / "checkpoint"),
                     save_checkpoint=False, fraction_per_label_id=fractions, **run_kw)
    run_seconds = time.perf_counter() - t_run

    info = syn.metadata.label_info

    def labels_of(label_id: int) -> dict[str, str]:
        values = info[label_id]["column_values"]
        return {"label1": f"Business Category: {values['business_category']}",
                "label2": f"Review Stars: {values['review_stars']}"}

    frame = syn.data_frame
    final = frame[frame[VARIATION_API_FOLD_ID_COLUMN_NAME] == -1]
    with open(out / "synthetic.jsonl", "w", encoding="utf-8") as fh:
        for text, y in zip(final[TEXT_DATA_COLUMN_NAME], final[LABEL_ID_COLUMN_NAME],
                           strict=True):
            fh.write(json.dumps({"text": text, "labels": labels_of(int(y))}) + "\n")
    # the random API's texts in label order: pe generates label by label, N_y each
    zs_labels: list[int] = []
    initial = runner._get_num_samples_per_label_id(args.samples, fractions)
    for y, n_y in enumerate(initial):
        zs_labels.extend([y] * int(n_y))
    with open(out / "zero_shot.jsonl", "w", encoding="utf-8") as fh:
        for text, y in zip(zero_shot, zs_labels, strict=True):
            fh.write(json.dumps({"text": text, "labels": labels_of(int(y))}) + "\n")
    embed_s = timer.seconds.get("embedding", 0.0)
    result = {
        "tool": "pe (microsoft/DPSDA)", "engine": "transformers (pe's HuggingfaceLLM, float16)",
        "wall_seconds": time.perf_counter() - t_all, "run_seconds": run_seconds,
        "load_seconds": load_seconds,
        "generation_seconds": timer.seconds.get("generation", 0.0),
        "embedding_seconds": embed_s,
        "voting_seconds": (timer.seconds.get("histogram", 0.0) - embed_s
                           + timer.seconds.get("noise", 0.0)),
        "selection_seconds_incl_variations": timer.seconds.get("population_next", 0.0),
        "generated_tokens": tokens["generated"], "llm_requests": tokens["requests"],
        "epsilon": epsilon, "delta": args.delta, "noise_multiplier": sigma,
        "accounted_steps": steps, "label_fractions": label_note,
        "samples": int(len(final)), "generation_args": gen_args,
        "batch_size": args.batch_size, "labels": len(info),
    }
    (out / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
