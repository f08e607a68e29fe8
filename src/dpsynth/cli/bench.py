"""CLI commands: bench (speed/memory benchmarks)."""

from __future__ import annotations

import json

import typer

bench_app = typer.Typer(help="Benchmarks (speed and memory, measured side by side).",
                        no_args_is_help=True)


def _emit(res: dict, as_json: bool) -> None:
    """A benchmark's result: one JSON line, or ``key: value`` lines for a person."""
    if as_json:
        typer.echo(json.dumps(res))
        return
    for k, v in res.items():
        typer.echo(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


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

    try:
        res = bench_voting(private, synthetic, clusters, dim, seed, rate, threads=threads,
                           also_rates=tuple(also_rate))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _emit(res, as_json)


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

    try:
        res = bench_knn(private, synthetic, labels, dim, topics or None, spread, seed,
                        nlist or None, tuple(nprobe), ef_search, hnsw, reference, secpe, clusters,
                        threads, embeddings=embeddings, rerank=tuple(rerank), repeats=repeats,
                        pq_m=tuple(pq_m))
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _emit(res, as_json)


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

    try:
        res = bench_serving(model, clients, requests, tokens, max_batch)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _emit(res, as_json)


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

    try:
        res = bench_generation(model, prompts, tokens, rounds, baseline_batch)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _emit(res, as_json)


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

    try:
        texts = (load_texts(Path(data), column, limit) if data else demo_texts(limit))
        res = bench_embedding(texts, engine=engine, batch_size=batch_size,
                              threads=threads or None, rounds=rounds)
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    _emit(res, as_json)


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

    try:
        res = bench_private_prediction(model, docs, tokens, clip, rounds, top, dtype,
                                       stepper, max_doc_tokens, rows)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _emit(res, as_json)


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    root.add_typer(bench_app, name="bench")
