"""GEMM rates and memory bandwidth of this CPU, and SecPE's vote bound account with them.

    python benchmarks/bench_gemm.py [--size 2048] [--mb 512] [--threads 2] [--out FILE]
    python benchmarks/bench_gemm.py --render bench_all.json --md benchmarks/results/bounds.md

The first form measures (same code as `dpsynth bench bounds`); the second writes the markdown
report of a saved `dpsynth bench all --out` result.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dpsynth.bench.bounds import measure_rates, secpe_account
from dpsynth.bench.machine import Where
from dpsynth.bench.report import render


def main() -> None:
    """Measure, or render a saved `bench all` result."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--mb", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--render", type=Path, help="a `dpsynth bench all --out` JSON")
    ap.add_argument("--md", type=Path, help="where the rendered markdown goes")
    ap.add_argument("--command", default="dpsynth bench all --json")
    args = ap.parse_args()
    if args.render:
        text = render(json.loads(args.render.read_text()), args.command) + "\n"
        if args.md:
            args.md.write_text(text)
        else:
            print(text)
        return
    with Where() as where:
        rates = measure_rates(args.size, args.mb, args.threads)
    g = rates["gemm_gflops"]
    rates["secpe_1m_x_10k"] = secpe_account(1_000_000, 10_000, 1000, 384,
                                            max(g["torch_float32"], g["numpy_float32"]),
                                            rates["bandwidth_gbs"]["best"])
    rates["machine"] = where.result()
    text = json.dumps(rates, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
