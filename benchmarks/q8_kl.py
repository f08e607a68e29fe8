"""How far llama.cpp's Q8_0 arithmetic moves SmolLM2-135M's next-token distribution (issue 24,
point 4: is int8 with AVX2's integer dot products, the one int8 path this CPU class has, within
the KL bound?). An emulation in torch, no engine: Q8_0 rounds weights, and the activations
they multiply, in blocks of 32 along the input with one fp16 scale a block (max |x| / 127);
the products then sum exactly as in float32, so the KL measured is the rounding's own.

    env PYTHONPATH=src .venv/bin/python benchmarks/q8_kl.py [--docs 16] [--tokens 24]

Arms: Q8_0 weights and activations in every linear layer of the decoder (what ggml's Q8_0
matrix product computes on AVX2), the same with the output layer in float too (llama.cpp's
``--leave-output-tensor``), and weights only (activations float). Each row is one demo
document's rephrase prompt, followed by the float32 model's greedy tokens (the same sequence
for every arm). Prints the mean and largest KL(p_float || p_arm) per token over the full
vocabulary.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def q8_0(x: torch.Tensor) -> torch.Tensor:
    """Round ``x`` to Q8_0 along its last axis (blocks of 32, symmetric, fp16 scale)."""
    import torch

    blocks = x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)
    scale = (blocks.abs().amax(-1, keepdim=True) / 127).half().float()
    q = torch.where(scale > 0, torch.round(blocks / scale.clamp_min(1e-30)), 0).clamp(-127, 127)
    return (q * scale).reshape(x.shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=24)
    args = ap.parse_args()
    import copy

    import torch
    import torch.nn.functional as F

    from dpsynth.bench.private_prediction import _kl as kl_rows
    from dpsynth.demo_corpus import make_demo_corpus
    from dpsynth.llm import load_generator
    from dpsynth.methods.synrag.config import DEFAULT_REPHRASE
    from dpsynth.methods.synrag.private_prediction import prompt_parts

    gen = load_generator("smollm2", engine="transformers")
    model = gen.model.float().eval()

    def quantised(activations: bool, output: bool) -> torch.nn.Module:
        arm = copy.deepcopy(model)
        for name, layer in arm.named_modules():
            if not isinstance(layer, torch.nn.Linear) or (name == "lm_head" and not output):
                continue
            weight = q8_0(layer.weight.data)
            if name == "lm_head":  # tied to the embeddings in SmolLM2: untie before rounding
                layer.weight = torch.nn.Parameter(weight)
            else:
                layer.weight.data = weight
            if activations:
                layer.forward = (lambda x, w=layer.weight, b=layer.bias:
                                 F.linear(q8_0(x), w, b))
        return arm

    arms = {"Q8_0 weights and activations": quantised(True, True),
            "Q8_0, output layer float": quantised(True, False),
            "Q8_0 weights only": quantised(False, True)}
    texts = list(make_demo_corpus(max(args.docs, 60), seed=0)["text"])[:args.docs]
    prefix, suffix = prompt_parts(gen, DEFAULT_REPHRASE)
    kls: dict[str, list[np.ndarray]] = {name: [] for name in arms}
    with torch.inference_mode():
        for text in texts:
            ids = torch.tensor([gen.encode_prompt(prefix + text + suffix)])
            for _ in range(args.tokens - 1):  # the float model's greedy continuation
                nxt = model(ids).logits[0, -1].argmax()
                ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
            start = ids.shape[1] - args.tokens  # the positions that predict the T tokens
            ref = model(ids).logits[0, start:].numpy()
            for name, arm in arms.items():
                kls[name].append(kl_rows(ref, arm(ids).logits[0, start:].numpy()))
    print(f"{args.docs} documents x {args.tokens} tokens, KL(float32 || arm) per token")
    for name, parts in kls.items():
        kl = np.concatenate(parts)
        print(f"  {name}: mean {kl.mean():.5f}, p99 {np.quantile(kl, 0.99):.4f}, "
              f"max {kl.max():.4f}, tokens over 0.01: {(kl > 0.01).mean():.1%}")


if __name__ == "__main__":
    main()
