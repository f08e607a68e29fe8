"""Assemble BENCHMARKS.md from the sections the benchmarks wrote into benchmarks/results/.

    .venv/bin/python benchmarks/collect.py
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent
ORDER = ["generation", "augpe_voting", "voting", "yelp", "wasp", "secpe",
         "private_prediction", "medsynth"]
HEADER = """# Benchmarks

Every number here was measured by a script in `benchmarks/` on the machine it names, with the
paths being compared run side by side in one run (this machine is shared and noisy, so ratios
mean more than absolute times). Re-run a script, then `python benchmarks/collect.py`.

| section | script |
|---|---|
| Generation throughput, embedder | `bench_generation.py` |
| Aug-PE voting: faiss vs reference | `bench_augpe_voting.py` |
| SecPE representative voting | `dpsynth bench voting` (`src/dpsynth/bench/voting.py`) |
| Yelp: Aug-PE | `bench_yelp.py` |
| WASP: Banking77 | `bench_wasp.py` |
| SecPE vs Aug-PE on Yelp | `bench_secpe.py` |
| DP-SynRAG private prediction | `bench_private_prediction.py` |
| DP-SynRAG on Medical Synth | `bench_medsynth.py` |

"""


def main() -> None:
    results = ROOT / "results"
    parts = [HEADER]
    names = [n for n in ORDER if (results / f"{n}.md").is_file()]
    names += sorted(p.stem for p in results.glob("*.md") if p.stem not in ORDER)
    for name in names:
        parts.append((results / f"{name}.md").read_text().strip() + "\n\n")
    (ROOT.parent / "BENCHMARKS.md").write_text("".join(parts).rstrip() + "\n")


if __name__ == "__main__":
    main()
