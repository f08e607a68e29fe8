"""CLI commands: bench (speed/memory benchmarks)."""

from __future__ import annotations

import json

import typer

bench_app = typer.Typer(help="Benchmarks (speed and memory, measured side by side).",
                        no_args_is_help=True)


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
    if as_json:
        typer.echo(json.dumps(res))
        return
    for k, v in res.items():
        typer.echo(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


def register(root: typer.Typer) -> None:
    """Add this module's commands to the root app."""
    root.add_typer(bench_app, name="bench")
