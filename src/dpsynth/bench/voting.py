"""Benchmark: Aug-PE per-point voting vs SecPE representative voting (one iteration each).

Both paths see the same random unit embeddings (M private, N candidates, dimension d), generated
deterministically chunk by chunk so that no path ever holds all M private embeddings.

* per-point (Aug-PE): every private record votes for its nearest candidate, O(M N d).
* representative (SecPE): Poisson-sample the private records (rate ``rate``), sum the clipped
  sampled embeddings per public centre (centre assignments cached once, see
  ``representatives.assign_private``), add the noise, and let the K noisy representatives vote,
  O(M) + O(m d) + O(K N d).

One-time costs, reported on their own lines: KMeans on public embeddings
(``public_clustering_seconds``) and the private-to-centre assignment
(``private_assignment_seconds``).

Time: wall clock of the computation only; the time spent generating the random chunks is measured
separately and subtracted. Peak memory: each path runs in its own spawned subprocess; after its
inputs are ready a thread samples the process RSS (psutil) every 2 ms and the peak extra RSS over
the pre-path baseline is reported (this sees faiss/BLAS C allocations that tracemalloc misses).
The random chunks (``chunk`` rows x d float32) count towards both paths equally.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np


def _unit_chunk(seed: int, stream: int, idx: int, n: int, d: int) -> np.ndarray:
    rng = np.random.default_rng([seed, stream, idx])
    x = rng.standard_normal((n, d), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


PRIVATE, CANDIDATES, PUBLIC = 0, 1, 2


@dataclass
class TimedStream:
    """Deterministic private-embedding chunks; records the time spent generating them."""

    m: int
    d: int
    seed: int
    chunk: int = 16384
    gen_seconds: float = 0.0

    def __iter__(self) -> Iterator[np.ndarray]:
        for i, start in enumerate(range(0, self.m, self.chunk)):
            t = time.perf_counter()
            x = _unit_chunk(self.seed, PRIVATE, i, min(self.chunk, self.m - start), self.d)
            self.gen_seconds += time.perf_counter() - t
            yield x


def embeddings(n: int, d: int, seed: int, stream: int, chunk: int = 16384) -> np.ndarray:
    return np.concatenate(
        [_unit_chunk(seed, stream, i, min(chunk, n - s), d)
         for i, s in enumerate(range(0, n, chunk))]
    )


class PeakRSS:
    """Peak resident set size of this process above a baseline, sampled in a thread."""

    def __init__(self, interval: float = 0.002) -> None:
        import psutil

        self._proc = psutil.Process()
        self._interval = interval
        self._stop = threading.Event()
        self.baseline = 0
        self.peak = 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._proc.memory_info().rss)
            time.sleep(self._interval)

    def __enter__(self) -> PeakRSS:
        self.baseline = self._proc.memory_info().rss
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.baseline) / 2**20


def _per_point_job(m: int, n: int, d: int, seed: int, threads: int, q) -> None:
    import faiss

    from dpsynth.evolution.representatives import per_point_vote

    faiss.omp_set_num_threads(threads)
    cand = embeddings(n, d, seed, CANDIDATES)
    stream = TimedStream(m, d, seed)
    with PeakRSS() as mem:
        t = time.perf_counter()
        hist = per_point_vote(stream, cand)
        secs = time.perf_counter() - t - stream.gen_seconds
    q.put({"seconds": secs, "peak_mb": mem.extra_mb, "votes": float(hist.sum())})


def _representative_job(m: int, n: int, k: int, d: int, seed: int, rate: float, sigma: float,
                        threads: int, also_rates: tuple[float, ...], q) -> None:
    import faiss

    from dpsynth.evolution.representatives import (
        accumulate_private,
        add_representative_noise,
        assign_private,
        public_centres,
        representative_vote,
    )
    from dpsynth.privacy.noise import SeededNoise

    faiss.omp_set_num_threads(threads)
    cand = embeddings(n, d, seed, CANDIDATES)
    public = embeddings(max(40 * k, 2 * n), d, seed, PUBLIC)
    t = time.perf_counter()
    centres, sizes = public_centres(public, k, seed=seed)
    clustering = time.perf_counter() - t
    del public
    stream = TimedStream(m, d, seed)
    t = time.perf_counter()
    labels = assign_private(centres, stream, clip_R=1.0)
    assignment = time.perf_counter() - t - stream.gen_seconds
    rates = np.full(m, rate)
    noise = SeededNoise(seed)
    stream = TimedStream(m, d, seed)
    with PeakRSS() as mem:
        t0 = time.perf_counter()
        acc = accumulate_private(centres, stream, rates, 1.0, noise, labels=labels)
        reps = add_representative_noise(acc.sums, acc.counts, centres, sizes, 1.0, sigma, noise)
        t1 = time.perf_counter()
        hist = representative_vote(reps.e_tilde, reps.n_tilde, cand)
        t2 = time.perf_counter()
    noisy = t1 - t0 - stream.gen_seconds
    at_rate = {}
    for other in also_rates:  # same iteration at other sampling rates (time only)
        stream = TimedStream(m, d, seed)
        t0 = time.perf_counter()
        acc2 = accumulate_private(centres, stream, np.full(m, other), 1.0, noise, labels=labels)
        reps2 = add_representative_noise(acc2.sums, acc2.counts, centres, sizes, 1.0, sigma, noise)
        representative_vote(reps2.e_tilde, reps2.n_tilde, cand)
        at_rate[str(other)] = time.perf_counter() - t0 - stream.gen_seconds
    q.put({
        "seconds_at_rate": at_rate,
        "seconds": noisy + (t2 - t1),
        "noisy_centres_seconds": noisy,
        "vote_seconds": t2 - t1,
        "peak_mb": mem.extra_mb,
        "public_clustering_seconds": clustering,
        "private_assignment_seconds": assignment,
        "clusters": int(len(centres)),
        "sampled": int(acc.n_sampled),
        "votes": float(hist.sum()),
    })


def _in_subprocess(target, *args) -> dict:
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(*args, q))
    p.start()
    out = q.get()
    p.join()
    if p.exitcode != 0:
        raise RuntimeError(f"benchmark subprocess failed with exit code {p.exitcode}")
    return out


def bench_voting(private: int, synthetic: int, clusters: int = 1000, dim: int = 384,
                 seed: int = 0, rate: float = 1.0, sigma: float = 1.0,
                 threads: int = 2, also_rates: tuple[float, ...] = ()) -> dict:
    """Run both paths side by side (each in its own subprocess) and return the measurements."""
    if private < 1 or synthetic < 1 or clusters < 1 or dim < 1:
        raise ValueError("--private, --synthetic, --clusters and --dim must be >= 1")
    if not all(0 <= x <= 1 for x in (rate, *also_rates)):
        raise ValueError("--rate and --also-rate must lie in [0, 1]")
    rep = _in_subprocess(_representative_job, private, synthetic, clusters, dim, seed, rate,
                         sigma, threads, tuple(also_rates))
    pp = _in_subprocess(_per_point_job, private, synthetic, dim, seed, threads)
    return {
        "private": private,
        "synthetic": synthetic,
        "clusters": rep["clusters"],
        "dim": dim,
        "rate": rate,
        "threads": threads,
        "per_point_seconds": pp["seconds"],
        "representative_seconds": rep["seconds"],
        "representative_noisy_centres_seconds": rep["noisy_centres_seconds"],
        "representative_vote_seconds": rep["vote_seconds"],
        "speedup": pp["seconds"] / max(rep["seconds"], 1e-9),
        "representative_seconds_at_rate": rep["seconds_at_rate"],
        "speedup_at_rate": {r: pp["seconds"] / max(v, 1e-9)
                            for r, v in rep["seconds_at_rate"].items()},
        "per_point_peak_mb": pp["peak_mb"],
        "representative_peak_mb": rep["peak_mb"],
        "public_clustering_seconds": rep["public_clustering_seconds"],
        "private_assignment_seconds": rep["private_assignment_seconds"],
        "sampled_private": rep["sampled"],
        "memory_method": "peak RSS above pre-path baseline, psutil sampled every 2 ms, "
                         "one spawned subprocess per path",
    }
