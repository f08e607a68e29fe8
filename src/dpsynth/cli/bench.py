"""CLI commands: bench (speed/memory benchmarks)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from dpsynth.bench.bounds import measure_rates, secpe_account
from dpsynth.bench.machine import Where, describe
from dpsynth.bench.report import render
from dpsynth.bench.suite import SECTIONS, Sizes, bench_all

bench_app = typer.Typer(help="Benchmarks (speed and memory, measured side by side).",
                        no_args_is_help=True)


def _emit(res: dict, as_json: bool) -> None:
    """A benchmark's result: one JSON line, or ``key: value`` lines for a person."""
    if as_json:
        typer.echo(json.dumps(res))
        return
    for k, v in res.items():
        typer.echo(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


def _measured(fn: Callable[[], dict[str, Any]], as_json: bool,
              errors: tuple[type[Exception], ...] = (ValueError,)) -> None:
    """Run one benchmark inside :class:`~dpsynth.bench.machine.Where` and print its result with
    the ``"machine"`` it ran on (CPU, instruction sets, load, ``quiet``)."""
    with Where() as where:
        try:
            res = fn()
        except errors as exc:
            raise typer.BadParameter(str(exc)) from exc
    res["machine"] = where.result()
    _emit(res, as_json)


@bench_app.command("voting")
def voting(
    private: int = typer.Option(..., "--private", help="Number of private embeddings M."),
    synthetic: int = typer.Option(..., "--synthetic", help="Number of candidates N."),
    clusters: int = typer.Option(1000, "--clusters", help="Public KMeans centres K."),
    dim: int = typer.Option(384, "--dim", help="Embedding dimension."),
    seed: int = typer.Option(0, "--seed"),
    rate: float = typer.Option(1.0, "--rate",
                               help="Poisson sampling rate of every private record (1 = all)."),
    also_rate: list[float] = typer.Option(  # noqa: B006
        [], "--also-rate", help="Also time the representative path at this rate (repeatable)."
    ),
    threads: int = typer.Option(2, "--threads", help="faiss OpenMP threads."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """Aug-PE per-point voting vs SecPE representative voting on the same random embeddings."""
    from dpsynth.bench.voting import bench_voting

    _measured(lambda: bench_voting(private, synthetic, clusters, dim, seed, rate, threads=threads,
                                   also_rates=tuple(also_rate)), as_json)


@bench_app.command("knn")
def knn(
    private: int = typer.Option(..., "--private", help="Number of private embeddings M."),
    synthetic: int = typer.Option(..., "--synthetic", help="Number of candidates N."),
    labels: int = typer.Option(1, "--labels", help="Labels (records vote within their label)."),
    dim: int = typer.Option(384, "--dim", help="Embedding dimension."),
    topics: int = typer.Option(0, "--topics",
                               help="Topics of the clustered embeddings (0 = N / 50)."),
    spread: float = typer.Option(1.0, "--spread", help="Spread of a topic's embeddings."),
    nlist: int = typer.Option(0, "--nlist", help="IVF lists per label (0 = 2 sqrt(n))."),
    nprobe: list[int] = typer.Option(  # noqa: B006
        [1, 2], "--nprobe", help="IVF lists searched (repeatable: one IVF run each)."
    ),
    hnsw: bool = typer.Option(False, "--hnsw", help="Also time HNSW voting."),
    ef_search: int = typer.Option(64, "--ef-search", help="HNSW efSearch."),
    reference: bool = typer.Option(True, "--reference/--no-reference",
                                   help="Also run the scikit-learn reference vote."),
    secpe: bool = typer.Option(True, "--secpe/--no-secpe",
                               help="Also time SecPE's representative vote."),
    clusters: int = typer.Option(1000, "--clusters", help="SecPE public KMeans centres K."),
    seed: int = typer.Option(0, "--seed"),
    threads: int = typer.Option(2, "--threads", help="faiss OpenMP threads."),
    rerank: list[int] = typer.Option(  # noqa: B006
        [16], "--rerank", help="PQ: candidates re-scored exactly per neighbour (repeatable)."
    ),
    pq_m: list[int] = typer.Option(  # noqa: B006
        [0], "--pq-m", help="PQ sub-vectors (0 = d / 2; repeatable)."
    ),
    embeddings: str | None = typer.Option(
        None, "--embeddings", help="An .npz of real embeddings (benchmarks/bench_knn.py)."
    ),
    repeats: int = typer.Option(1, "--repeats", help="Alternating exact / ANN rounds."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """Exact vs approximate (PQ, IVF, HNSW) Aug-PE voting on the same embeddings."""
    from dpsynth.bench.voting import bench_knn

    _measured(lambda: bench_knn(private, synthetic, labels, dim, topics or None, spread, seed,
                                nlist or None, tuple(nprobe), ef_search, hnsw, reference, secpe,
                                clusters, threads, embeddings=embeddings, rerank=tuple(rerank),
                                repeats=repeats, pq_m=tuple(pq_m)), as_json)


@bench_app.command("serving")
def serving(
    model: str = typer.Option("smollm2", "--model", help="Model to serve."),
    clients: int = typer.Option(32, "--clients", help="Concurrent clients."),
    requests: int = typer.Option(64, "--requests", help="Completions sent in all."),
    tokens: int = typer.Option(16, "--tokens", help="Max new tokens per completion."),
    max_batch: int = typer.Option(32, "--max-batch", help="Micro-batch size of the fast mode."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """`llm serve` one request at a time vs micro-batching, on loopback, side by side."""
    from dpsynth.bench.serving import bench_serving
    from dpsynth.errors import require

    for module in ("fastapi", "uvicorn"):
        require(module, "serve", "`dpsynth bench serving`")

    _measured(lambda: bench_serving(model, clients, requests, tokens, max_batch), as_json)


@bench_app.command("generation")
def generation(
    model: str = typer.Option("smollm2", "--model", help="Offline model name or HF directory."),
    prompts: int = typer.Option(64, "--prompts", help="Chat prompts (same for both paths)."),
    tokens: int = typer.Option(64, "--tokens", help="Max new tokens per prompt."),
    rounds: int = typer.Option(1, "--rounds", help="Rounds, alternating which path runs first."),
    baseline_batch: int = typer.Option(16, "--baseline-batch",
                                       help="Batch size of the transformers baseline."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """Local generation: the default engine vs transformers float32 at batch 16, side by side."""
    from dpsynth.bench.generation import bench_generation

    _measured(lambda: bench_generation(model, prompts, tokens, rounds, baseline_batch), as_json)


@bench_app.command("embedding")
def embedding(
    data: str = typer.Option("", "--data", help="CSV/JSONL of public texts (default: the "
                             "built-in demo corpus)."),
    column: str = typer.Option("text", "--column", help="Text column of --data."),
    limit: int = typer.Option(1000, "--limit", help="Texts embedded per round."),
    engine: str = typer.Option("auto", "--engine", help="auto, onnx, openvino or torch."),
    batch_size: int = typer.Option(16, "--batch-size", help="Rows a pass (embedder.batch_size)."),
    threads: int = typer.Option(0, "--threads", help="CPU threads (0: all cores)."),
    rounds: int = typer.Option(3, "--rounds", help="Alternating timed rounds per engine."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """Embedding: torch (today's path) vs a fast engine on the same texts, side by side."""
    from pathlib import Path

    from dpsynth.bench.embedding import bench_embedding, demo_texts, load_texts

    def run() -> dict[str, Any]:
        texts = (load_texts(Path(data), column, limit) if data else demo_texts(limit))
        return bench_embedding(texts, engine=engine, batch_size=batch_size,
                               threads=threads or None, rounds=rounds)

    _measured(run, as_json, (ValueError, OSError))


@bench_app.command("private-prediction")
def private_prediction(
    model: str = typer.Option("smollm2", "--model", help="Offline model name or HF directory."),
    docs: int = typer.Option(16, "--docs", help="Documents of the cluster (demo corpus)."),
    tokens: int = typer.Option(24, "--tokens", help="Private tokens T."),
    clip: float = typer.Option(0.3, "--clip", help="Clip c."),
    top: int = typer.Option(64, "--top", help="Public top tokens in the candidate set."),
    dtype: str = typer.Option("auto", "--dtype", help="auto, float32 or bfloat16."),
    stepper: str = typer.Option("auto", "--stepper", help="auto, openvino or transformers."),
    rounds: int = typer.Option(2, "--rounds", help="Rounds, alternating which path runs first."),
    max_doc_tokens: int = typer.Option(384, "--max-doc-tokens",
                                       help="synrag.max_doc_tokens: the rows' public width."),
    rows: int | None = typer.Option(
        None, "--rows", help="synrag.stepper_rows: rows per decode pass (default: --docs, "
                             "as a build's default of k)."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """DP-SynRAG private prediction: float32 over the whole vocabulary (today's path) vs the
    default (each document's logits computed apart from the others, OpenVINO where it runs the
    model, bf16 where native, public candidate set) and the previous default (torch bf16,
    batched), side by side; KL to float32."""
    from dpsynth.bench.private_prediction import bench_private_prediction

    _measured(lambda: bench_private_prediction(model, docs, tokens, clip, rounds, top, dtype,
                                               stepper, max_doc_tokens, rows), as_json)


@bench_app.command("dp-finetune")
def dp_finetune(
    model: str = typer.Option("smollm2", "--model", help="Offline model name or HF directory."),
    samples: int = typer.Option(8, "--samples", help="Records in the timed DP-SGD step."),
    modes: str = typer.Option(
        "loop,hooks,ghost", "--modes",
        help="Per-sample gradient paths, comma-separated: loop, hooks, ghost, plain (NOT "
             "private: a reference), recompute (loop without stored lower-layer states), "
             "each optionally -topK (adapters on the last K layers); loop optionally -wN "
             "(N pass workers, one thread each)."),
    steps: int = typer.Option(1, "--steps", help="Timed steps over the same records (each "
                                                 "an epoch at q = 1)."),
    tokens: int = typer.Option(64, "--tokens", help="Tokens per record (the most, --mixed)."),
    mixed: bool = typer.Option(False, "--mixed",
                               help="Record lengths drawn from tokens/4 to tokens (seed 0)."),
    threads: int = typer.Option(2, "--threads", help="torch threads."),
    micro_batch: int = typer.Option(8, "--micro-batch",
                                    help="Records per pass of hooks, ghost and plain."),
    in_process: bool = typer.Option(
        False, "--in-process", help="Run every path in this process (faster to start; the "
                                    "peak memory is then this process's, not per path)."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """DP-SGD per-sample gradients (dp_finetune's loop, Opacus hooks, ghost clipping) side by
    side: CPU s / sample and peak memory of each, each path in its own process."""
    from dpsynth.bench.dp_finetune import bench_dp_finetune, lines

    with Where() as where:
        try:
            res = bench_dp_finetune(model, [m.strip() for m in modes.split(",") if m.strip()],
                                    samples, threads, tokens, micro_batch,
                                    isolate=not in_process, mixed=mixed, steps=steps)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    res["machine"] = where.result()
    if as_json:
        typer.echo(json.dumps(res))
        return
    for line in lines(res):
        typer.echo(line)


@bench_app.command("bounds")
def bounds(
    gemm_size: int = typer.Option(2048, "--gemm-size", help="Side of the square GEMMs."),
    copy_mb: int = typer.Option(512, "--copy-mb", help="MB of the copied array."),
    threads: int = typer.Option(2, "--threads", help="torch threads."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """This CPU's GEMM rates (float32, bf16, int8) and memory bandwidth, and the SecPE vote's
    bound account at 1M x 10k with them."""

    def run() -> dict[str, Any]:
        if min(gemm_size, copy_mb, threads) < 1:
            raise ValueError("--gemm-size, --copy-mb and --threads must be >= 1")
        rates = measure_rates(gemm_size, copy_mb, threads)
        g = rates["gemm_gflops"]
        rates["secpe_1m_x_10k"] = secpe_account(
            1_000_000, 10_000, 1000, 384, max(g["torch_float32"], g["numpy_float32"]),
            rates["bandwidth_gbs"]["best"])
        return rates

    _measured(run, as_json)


@bench_app.command("secpe-profile")
def secpe_profile(
    private: int = typer.Option(1_000_000, "--private", help="Private embeddings M."),
    synthetic: int = typer.Option(10_000, "--synthetic", help="Candidates N."),
    clusters: int = typer.Option(1000, "--clusters", help="Public centres K."),
    dim: int = typer.Option(384, "--dim", help="Embedding dimension."),
    rate: float = typer.Option(1.0, "--rate", help="Poisson sampling rate."),
    threads: int = typer.Option(2, "--threads", help="faiss OpenMP threads."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """SecPE's representative vote phase by phase (accumulate, release, vote), and the
    accumulate with the clip folded into the one-hot (no copy of the rows), checked equal."""
    from dpsynth.bench.voting import profile_representative

    def run() -> dict[str, Any]:
        if min(private, synthetic, clusters, dim, threads) < 1 or not 0 <= rate <= 1:
            raise ValueError("sizes and --threads must be >= 1, --rate in [0, 1]")
        return profile_representative(private, synthetic, clusters, dim, rate=rate,
                                      threads=threads)

    _measured(run, as_json)


@bench_app.command("all")
def bench_all_cmd(
    private: int = typer.Option(1_000_000, "--private", help="voting: private embeddings M."),
    synthetic: int = typer.Option(10_000, "--synthetic", help="voting: candidates N."),
    clusters: int = typer.Option(1000, "--clusters", help="voting: public centres K."),
    dim: int = typer.Option(384, "--dim", help="voting and knn: embedding dimension."),
    threads: int = typer.Option(2, "--threads", help="faiss / torch threads."),
    embed_texts: int = typer.Option(1000, "--embed-texts", help="embedding: texts a round."),
    embed_rounds: int = typer.Option(2, "--embed-rounds", help="embedding: rounds per engine."),
    model: str = typer.Option("smollm2", "--model", help="generation: model."),
    prompts: int = typer.Option(64, "--prompts", help="generation: prompts."),
    tokens: int = typer.Option(64, "--tokens", help="generation: max new tokens."),
    gen_rounds: int = typer.Option(1, "--gen-rounds", help="generation: rounds."),
    baseline_batch: int = typer.Option(16, "--baseline-batch",
                                       help="generation: transformers baseline batch."),
    knn_private: int = typer.Option(200_000, "--knn-private", help="knn: private rows."),
    knn_synthetic: int = typer.Option(10_000, "--knn-synthetic", help="knn: candidates."),
    gemm_size: int = typer.Option(2048, "--gemm-size", help="bounds: side of the GEMMs."),
    copy_mb: int = typer.Option(512, "--copy-mb", help="bounds: MB of the copied array."),
    only: list[str] = typer.Option(  # noqa: B006
        [], "--only", help="Run only these sections (repeatable): bounds, voting, embedding, "
                           "generation, knn."),
    out: str = typer.Option("", "--out", help="Also write the JSON to this file."),
    md: str = typer.Option("", "--md", help="Also write the bounds report (markdown) here."),
    as_json: bool = typer.Option(False, "--json", help="Print only JSON."),
) -> None:
    """The hot-path set in one run (voting, embedding, generation, knn, and this CPU's bounds),
    each ratio beside its goal, each section with the machine and load it ran under."""
    sizes = Sizes(private, synthetic, clusters, dim, threads, embed_texts, embed_rounds, model,
                  prompts, tokens, gen_rounds, baseline_batch, knn_private, knn_synthetic,
                  gemm_size, copy_mb, tuple(only) or SECTIONS)

    def progress(name: str, sec: dict[str, Any]) -> None:
        if out:  # what is done so far survives a later section's crash or a kill
            part = Path(out).with_suffix(".partial.json")
            done = json.loads(part.read_text()) if part.is_file() else {}
            part.write_text(json.dumps({**done, name: sec}, indent=1) + "\n")
        if not as_json:
            typer.echo(f"{name}: {_line(sec)}", err=True)

    if out:
        Path(out).with_suffix(".partial.json").unlink(missing_ok=True)
    try:
        res = bench_all(sizes, progress)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if out:
        Path(out).write_text(json.dumps(res, indent=1) + "\n")
        Path(out).with_suffix(".partial.json").unlink(missing_ok=True)
    if md:
        Path(md).write_text(render(res, "dpsynth " + " ".join(sys.argv[1:])) + "\n")
    if as_json:
        typer.echo(json.dumps(res))
        return
    for row in res["summary"]:
        typer.echo(f"{row['section']:<11} {_line(row)}")
    typer.echo(f"machine: {describe(res['machine'])}; {res['seconds']:.0f} s")
    if res["machine"].get("capacity") and res["machine"]["capacity"]["slowed"]:
        typer.echo("this machine delivered under "
                   f"{res['machine']['capacity']['share']:.0%} of its CPU's usual rate (a "
                   "contended host): rerun before quoting these figures", err=True)


def _line(sec: dict[str, Any]) -> str:
    """One section's ratio beside its goal, for a person."""
    if sec.get("error"):
        return f"ERROR {sec['error']}"
    if sec.get("ratio") is None:
        return "measured"
    quiet = sec.get("quiet", sec.get("machine", {}).get("quiet"))
    return (f"{sec['ratio']:.3g} ({sec['ratio_name']}); goal {sec['goal']}; "
            f"met: {sec['meets_goal']}; quiet: {quiet}")


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    root.add_typer(bench_app, name="bench")
