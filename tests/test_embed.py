"""The embedder: engines (torch, onnx, openvino) on the real offline all-MiniLM-L6-v2, the
sqlite cache, and the streamed, resumable private-embedding file (fast, with the fake)."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

import dpsynth.embed as embed_mod
import dpsynth.embed.embedder as embedder_mod
from dpsynth.embed import Embedder, EngineUnavailable, embed_to_file
from fakes import FakeEmbedder

SENTS = [
    "The cat sat on the mat.",
    "A kitten is resting on a rug.",
    "The central bank raised interest rates again.",
]

models = pytest.mark.models


@pytest.fixture(scope="module")
def demo_texts() -> list[str]:
    """Two dozen texts of the built-in (synthetic) demo corpus (padded widths 48 to 128)."""
    from dpsynth.bench.embedding import demo_texts as texts

    return texts(24, seed=3)


@pytest.fixture(scope="module")
def agreement_texts(demo_texts) -> list[str]:
    """Demo texts plus an empty, a blank and a past-the-256-token-limit text."""
    return demo_texts + ["", "   ", "x " * 600]


@pytest.fixture(scope="module")
def engines(model_cache) -> Callable[[str], Embedder]:
    """``engines(name)``: one Embedder of that engine for the module, 4 rows a pass (each
    pass costs its full shape, so few texts need few rows to share passes). Read-only use:
    embed / encode_uncached without a disk cache."""
    made: dict[str, Embedder] = {}

    def get(engine: str) -> Embedder:
        if engine != "torch":
            pytest.importorskip("onnxruntime" if engine == "onnx" else "openvino")
        if engine not in made:
            made[engine] = Embedder("minilm", engine=engine, model_cache=model_cache,
                                    batch_size=4)
        return made[engine]

    return get


@pytest.fixture(scope="module")
def torch_vectors(engines, agreement_texts) -> np.ndarray:
    """Today's torch path on ``agreement_texts`` (the reference)."""
    return engines("torch").embed(agreement_texts)


@models
def test_unit_norm_dim_and_similarity(embedder) -> None:
    v = embedder.embed(SENTS)
    assert embedder.dim == 384 and embedder.name == "minilm"
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[1, 2] + 0.3
    assert embedder.embed([]).shape == (0, 384)
    with pytest.raises(TypeError, match="single str"):
        embedder.embed("not a list")  # type: ignore[arg-type]


@models
def test_iter_embed_streams_chunks(embedder) -> None:
    chunks = list(embedder.iter_embed(iter(SENTS * 2), chunk=4))
    assert [c.shape for c in chunks] == [(4, 384), (2, 384)]
    np.testing.assert_allclose(np.vstack(chunks), np.vstack([embedder.embed(SENTS)] * 2), atol=1e-5)


@models
def test_cache_computes_only_misses(embedder, tmp_path) -> None:
    emb = Embedder("minilm", cache_dir=tmp_path / "emb", batch_size=8)
    first = emb.embed(SENTS + [SENTS[0]])
    assert emb.computed == 3 and emb.cached == 0  # the duplicate is computed once
    db = tmp_path / "emb" / "embeddings.sqlite"
    assert (db.stat().st_mode & 0o777) == 0o600
    again = emb.embed(["A new sentence about rivers.", SENTS[2], SENTS[0]])
    assert emb.computed == 4 and emb.cached == 2
    np.testing.assert_array_equal(again[1], first[2])
    np.testing.assert_array_equal(again[2], first[0])
    np.testing.assert_allclose(first[:3], embedder.embed(SENTS), atol=1e-5)
    emb.close()


# -- fast engines ---------------------------------------------------------------------------

@models
@pytest.mark.parametrize("engine", ["onnx", "openvino"])
def test_fast_engine_agrees_with_torch(engine, engines, torch_vectors, agreement_texts) -> None:
    """>= 0.999 cosine to today's torch vectors on two dozen demo texts and the edge cases
    (empty, blank, past the token limit), row for row."""
    fast = engines(engine)
    assert fast.engine_tag.startswith(engine) and fast.threads >= 1
    texts, ref = agreement_texts, torch_vectors
    got = fast.embed(texts)
    assert got.shape == ref.shape and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-3)
    cos = np.sum(ref * got, axis=1)
    assert cos.min() >= embed_mod.MIN_AGREEMENT, cos.min()
    # order-independent: the length sort inside a batch does not mix rows up
    np.testing.assert_allclose(fast.embed(texts[::-1])[::-1], got, atol=2e-3)


@models
@pytest.mark.parametrize("engine", ["torch", "onnx", "openvino"])
def test_a_texts_vector_is_its_own(engine, engines, demo_texts) -> None:
    """A text's vector is a function of that text alone, bit for bit: embedded alone, amid the
    others in another order, or with a longer text and one text more beside it. (A batch padded
    to its longest text moved a text's vector by up to 2e-7 on every engine, so one record
    coming in moved the others' vectors and, at a near tie, their votes.) 12 texts at 4 rows a
    pass: together, passes of 4 texts and of 1 (widths 48 to 128); alone, 1 text and 3
    fillers a pass."""
    emb = engines(engine)
    texts = demo_texts[:12]
    together = emb.encode_uncached(texts)
    alone = np.stack([emb.encode_uncached([t])[0] for t in texts])
    np.testing.assert_array_equal(together, alone)
    perm = np.random.default_rng(0).permutation(len(texts))
    beside = emb.encode_uncached([texts[i] for i in perm] + [" ".join(texts[:6])])
    np.testing.assert_array_equal(beside[: len(texts)], together[perm])


def test_fixed_shape_passes_cover_every_text_once_at_its_own_width() -> None:
    from dpsynth.fixed_shape import fixed_shape_arrays, fixed_shape_passes, padded_width

    assert [padded_width(n, 256) for n in (1, 16, 17, 64, 65, 96, 97, 300)] == \
        [16, 16, 32, 64, 96, 96, 128, 256]
    lengths = [3, 40, 17, 3, 100, 5, 3, 300, 16]
    passes = fixed_shape_passes(lengths, 2, 256)
    seen = np.concatenate([idx for _, idx in passes])
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for width, idx in passes:
        assert 1 <= len(idx) <= 2
        assert all(padded_width(lengths[i], 256) == width for i in idx)
    assert [w for w, _ in passes] == sorted((w for w, _ in passes), reverse=True)
    ids, mask = fixed_shape_arrays([[101, 7, 102], [101, 102]], 4, 3, 0, [101, 102])
    assert ids.tolist() == [[101, 7, 102, 0], [101, 102, 0, 0], [101, 102, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 0, 0]]
    with pytest.raises(ValueError):
        fixed_shape_passes([3], 0, 256)
    # the embedders' rule: every width a multiple of WIDTH_STEP
    from dpsynth.embed.engines import WIDTH_STEP

    assert WIDTH_STEP == 8
    assert [padded_width(n, 256, 8) for n in (1, 8, 9, 17, 65, 250, 300)] == \
        [8, 8, 16, 24, 72, 256, 256]
    assert [w for w, _ in fixed_shape_passes(lengths, 9, 256, 8)] == [256, 104, 40, 24, 16, 8]
    with pytest.raises(ValueError):
        padded_width(3, 256, 0)


@models
def test_export_is_cached_and_reused(model_cache) -> None:
    pytest.importorskip("onnxruntime")
    Embedder("minilm", engine="onnx", model_cache=model_cache)
    folder = embed_mod.export_dir(embed_mod.minilm_dir(), model_cache)
    onnx_file = folder / "model.onnx"
    stamp = onnx_file.stat().st_mtime_ns
    agreement = json.loads((folder / "agreement.json").read_text())
    assert agreement["onnx"] >= embed_mod.MIN_AGREEMENT
    again = Embedder("minilm", engine="onnx", model_cache=model_cache)
    assert onnx_file.stat().st_mtime_ns == stamp and again.engine_tag == "onnx"
    assert again.cache_key == f"minilm@onnx/{embedder_mod.VECTORS}"


@models
def test_auto_falls_back_when_an_engine_disagrees(model_cache, monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setattr(embedder_mod, "MIN_AGREEMENT", 1.5)  # no engine can agree this well
    with pytest.raises(EngineUnavailable, match="agrees with torch only"):
        Embedder("minilm", engine="onnx", model_cache=model_cache)
    auto = Embedder("minilm", engine="auto", model_cache=model_cache)
    assert auto.engine_tag == "torch" and auto.cache_key == f"minilm/{embedder_mod.VECTORS}"
    assert set(auto.skipped) == {"openvino", "onnx"}


@models
def test_auto_skips_a_missing_package(model_cache, monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setitem(sys.modules, "openvino", None)  # import openvino -> ImportError
    auto = Embedder("minilm", model_cache=model_cache)
    assert auto.engine_tag == "onnx" and "needs openvino" in auto.skipped["openvino"]


@models
def test_non_mean_pooling_model_stays_on_torch(tmp_path, model_cache) -> None:
    src = embed_mod.minilm_dir()
    model = tmp_path / "cls-model"
    model.mkdir()
    for item in src.iterdir():  # the same weights (linked), CLS pooling instead of mean
        if item.name == "1_Pooling":
            shutil.copytree(item, model / item.name)
        else:
            (model / item.name).symlink_to(item)
    pool = model / "1_Pooling" / "config.json"
    cfg = json.loads(pool.read_text())
    cfg.update(pooling_mode_cls_token=True, pooling_mode_mean_tokens=False)
    pool.write_text(json.dumps(cfg))
    auto = Embedder(str(model), model_cache=model_cache)
    assert auto.engine_tag == "torch" and "not mean pooling" in auto.skipped["onnx"]
    with pytest.raises(EngineUnavailable, match="not mean pooling"):
        Embedder(str(model), engine="onnx", model_cache=model_cache)


def test_bad_engine_and_threads_are_refused() -> None:
    with pytest.raises(ValueError, match="engine 'tpu'"):
        Embedder("minilm", engine="tpu")
    with pytest.raises(ValueError, match="threads"):
        Embedder("minilm", threads=0)


def test_config_engine_field() -> None:
    from pydantic import ValidationError

    from dpsynth.config import EmbedderConfig

    assert EmbedderConfig().engine == "auto" and EmbedderConfig().threads is None
    assert EmbedderConfig(engine="onnx", threads=2).threads == 2
    with pytest.raises(ValidationError):
        EmbedderConfig(engine="cuda")


@models
def test_bench_embedding_cli_json(model_cache, monkeypatch, small_probe) -> None:
    from typer.testing import CliRunner

    from dpsynth.cli import app

    monkeypatch.setenv("DPSYNTH_MODEL_CACHE", str(model_cache))
    res = CliRunner().invoke(app, ["bench", "embedding", "--limit", "4", "--batch-size", "4",
                                   "--rounds", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    for key in ("engine", "sentences_per_second", "baseline_sentences_per_second", "speedup",
                "min_cosine"):
        assert key in out
    assert out["texts"] == 4 and out["min_cosine"] >= 0.999
    assert out["speedup"] == pytest.approx(
        out["sentences_per_second"] / out["baseline_sentences_per_second"], rel=0.01)


# -- streamed, resumable private embeddings (fake embedder: fast) ---------------------------

def _texts(n: int) -> list[str]:
    return [f"record {i} about topic {i % 7} and item {i * 13 % 11}" for i in range(n)]


class _Watched:
    """A text stream that records how far it has been read."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.read = 0

    def __iter__(self) -> Iterator[str]:
        for t in self.texts:
            self.read += 1
            yield t


class _CountingEmbedder(FakeEmbedder):
    """Fails after ``fail_after`` chunks (a crash mid-file); records the stream position."""

    def __init__(self, stream: _Watched | None = None, fail_after: int | None = None) -> None:
        super().__init__(dim=8)
        self.stream = stream
        self.fail_after = fail_after
        self.calls: list[tuple[int, int]] = []  # (texts in the chunk, texts read so far)

    def embed(self, texts, *, progress=False):  # type: ignore[override]
        if self.fail_after is not None and len(self.calls) == self.fail_after:
            raise RuntimeError("killed")
        self.calls.append((len(texts), self.stream.read if self.stream else -1))
        return super().embed(texts)


def test_embed_to_file_streams_into_a_private_memmap(tmp_path) -> None:
    texts = _texts(23)
    stream = _Watched(texts)
    emb = _CountingEmbedder(stream)
    path = tmp_path / "private" / "private-embeddings.npy"
    logged: list[str] = []
    out = embed_to_file(emb, stream, len(texts), path, chunk=5, log=logged.append)
    # log.txt sits outside private/: no text and no count of the private records
    assert logged == ["embedding the private records"]
    assert not any(ch.isdigit() for m in logged for ch in m)
    assert isinstance(out, np.memmap) and out.shape == (23, 8) and out.dtype == np.float32
    np.testing.assert_array_equal(np.asarray(out), FakeEmbedder(dim=8).embed(texts))
    # one chunk at a time: the stream is never read more than one chunk ahead
    assert [c for c, _ in emb.calls] == [5, 5, 5, 5, 3]
    assert all(read <= (i + 1) * 5 for i, (_, read) in enumerate(emb.calls))
    assert (path.stat().st_mode & 0o777) == 0o600
    state = path.with_name(path.name + ".progress.json")
    assert (state.stat().st_mode & 0o777) == 0o600
    assert json.loads(state.read_text())["rows"] == 23
    again = _CountingEmbedder()
    np.testing.assert_array_equal(embed_to_file(again, texts, 23, path, chunk=5), out)
    assert again.calls == []  # finished file reused


def test_embed_to_file_resumes_after_a_crash(tmp_path) -> None:
    texts = _texts(20)
    path = tmp_path / "emb.npy"
    crashing = _CountingEmbedder(fail_after=2)
    with pytest.raises(RuntimeError, match="killed"):
        embed_to_file(crashing, iter(texts), 20, path, chunk=6)
    state = json.loads(path.with_name(path.name + ".progress.json").read_text())
    assert state["rows"] == 12
    resumed = _CountingEmbedder()
    out = embed_to_file(resumed, iter(texts), 20, path, chunk=6)
    assert sum(c for c, _ in resumed.calls) == 8  # only the rows not yet written
    np.testing.assert_array_equal(np.asarray(out), FakeEmbedder(dim=8).embed(texts))


def test_embed_to_file_restarts_for_another_model_or_size(tmp_path) -> None:
    texts = _texts(10)
    path = tmp_path / "emb.npy"
    with pytest.raises(RuntimeError):
        embed_to_file(_CountingEmbedder(fail_after=1), texts, 10, path, chunk=4)
    other = _CountingEmbedder()
    other.name = "another-model"
    embed_to_file(other, texts, 10, path, chunk=4)
    assert sum(c for c, _ in other.calls) == 10  # the half-file of another model is not reused
    bigger = _CountingEmbedder()
    out = embed_to_file(bigger, _texts(12), 12, path, chunk=4)
    assert out.shape == (12, 8) and sum(c for c, _ in bigger.calls) == 12


def test_embed_to_file_restarts_a_damaged_file(tmp_path) -> None:
    texts = _texts(6)
    path = tmp_path / "emb.npy"
    with pytest.raises(RuntimeError):
        embed_to_file(_CountingEmbedder(fail_after=1), texts, 6, path, chunk=4)
    path.write_bytes(b"not an npy file")  # the state file still says 4 rows are written
    emb = _CountingEmbedder()
    out = embed_to_file(emb, texts, 6, path, chunk=4)
    assert sum(c for c, _ in emb.calls) == 6
    np.testing.assert_array_equal(np.asarray(out), FakeEmbedder(dim=8).embed(texts))


def test_embed_to_file_reuses_a_whole_legacy_file(tmp_path) -> None:
    path = tmp_path / "emb.npy"
    legacy = FakeEmbedder(dim=8).embed(_texts(4))
    np.save(path, legacy)
    emb = _CountingEmbedder()
    np.testing.assert_array_equal(embed_to_file(emb, _texts(4), 4, path), legacy)
    assert emb.calls == []


def test_embed_to_file_checks_the_stream_length(tmp_path) -> None:
    with pytest.raises(ValueError, match="stream ended at 3"):
        embed_to_file(FakeEmbedder(dim=8), _texts(3), 5, tmp_path / "a.npy", chunk=2)
    with pytest.raises(ValueError, match="more than the 3"):
        embed_to_file(FakeEmbedder(dim=8), _texts(5), 3, tmp_path / "b.npy", chunk=2)
    assert embed_to_file(FakeEmbedder(dim=8), [], 0, tmp_path / "c.npy").shape == (0, 8)


def test_uses_encode_uncached_when_present(tmp_path) -> None:
    class _Both(FakeEmbedder):
        cache_key = "fake@x"

        def __init__(self) -> None:
            super().__init__(dim=8)
            self.uncached = 0

        def encode_uncached(self, texts):
            self.uncached += len(texts)
            return super().embed(texts)

    emb = _Both()
    embed_to_file(emb, _texts(7), 7, tmp_path / "e.npy", chunk=3)
    assert emb.uncached == 7
    state = json.loads((tmp_path / "e.npy.progress.json").read_text())
    assert state["model"] == "fake@x"


def test_private_view_streams_private_embeddings(tmp_path) -> None:
    """PrivateView.private_embeddings of the run's engine (the production path: the PE
    methods' execution builds both) writes the resumable memmap."""
    from dpsynth.compute.embeddings import PrivateEmbeddings
    from dpsynth.context import PrivateView
    from dpsynth.embed.shared import SharedEmbedder
    from dpsynth.run_dataset import run_engine

    class _Data:
        texts = _texts(9)
        label_columns: list[str] = []

        def __len__(self) -> int:
            return len(self.texts)

        def joint_label_codes(self):
            return np.zeros(9, dtype=np.int64), [()]

    class _Run:
        private = tmp_path / "private"

        def log(self, message: str) -> None:
            self.logged = message

    from dpsynth.config import parse_config

    cfg = parse_config({"data": {"path": "x.csv", "text": "text", "labels": []},
                        "generators": [{"model": "smollm2"}],
                        "privacy": {"epsilon": 1.0, "noise": "seeded", "seed": 1}})
    _Run.private.mkdir(mode=0o700)
    embedder = SharedEmbedder(cfg.embedder, Path(_Run.private) / "embed-cache",
                              given=FakeEmbedder(dim=8))
    embeddings = PrivateEmbeddings(embedder, _Data(), Path(_Run.private) / "private-embeddings.npy")
    engine = run_engine(cfg, _Run(), _Data(), embeddings=embeddings)
    view = PrivateView(cfg, _Run(), _Data(), engine, embeddings=embeddings)
    assert engine.shard.emb is embeddings()  # the local engine votes on the same rows
    got = view.private_embeddings
    np.testing.assert_array_equal(np.asarray(got), FakeEmbedder(dim=8).embed(_Data.texts))
    assert isinstance(got, np.memmap)
    state = Path(_Run.private) / "private-embeddings.npy.progress.json"
    assert json.loads(state.read_text())["rows"] == 9
