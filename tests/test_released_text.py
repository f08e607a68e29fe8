"""Released text worth reading (issue 44): votes sized above the noise, the release drawn from
the last vote's winners, the texts' length from a DP histogram released with the label
counts, and public filters that keep chatter, echoes and placeholders out of the release."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpsynth.api import run_generation
from dpsynth.compute.kernels import finish, label_length_partial, sum_partials
from dpsynth.compute.shard import Shard, TextShard
from dpsynth.config import parse_config
from dpsynth.evolution import prompts as P
from dpsynth.evolution.lengths import (
    LENGTH_EDGES,
    N_BINS,
    Sizes,
    length_bin,
    tokens_for,
)
from dpsynth.evolution.parts import release_from_winners
from dpsynth.evolution.pool import Pool
from dpsynth.methods import get_method
from dpsynth.methods.pe import plan_pe
from dpsynth.planning import (
    FEW_TEXTS_A_VALUE,
    FEW_WINNERS,
    VOTE_MARGIN,
    PlanInputs,
    RunPlan,
    auto_population,
    generator_caps,
    voting_population,
)
from dpsynth.privacy import calibrate_steps
from fakes import FakeEmbedder, FakeGenerator
from test_release_check import pe_config, private_rows, write_csv

# ------------------------------------------------------------------------------ the lengths


def test_length_bins_are_the_public_edges() -> None:
    assert length_bin("") == 0 and length_bin("one two three") == 0
    assert length_bin("w " * 4) == 1 and length_bin("w " * 7) == 1 and length_bin("w " * 8) == 2
    assert length_bin("w " * 1000) == N_BINS - 1 == len(LENGTH_EDGES)


def test_sizes_read_label_counts_length_and_record_count_from_one_histogram() -> None:
    noisy = np.zeros((2, N_BINS))
    noisy[0, 2] = 30  # 8-15 words
    noisy[1, 3] = 60  # 16-31 words
    noisy[1, 5] = 10  # 64-127 words: the top 10 %
    noisy[0, 0] = -4  # noise below zero
    sizes = Sizes.of(noisy)
    assert sizes.label_counts.tolist() == [26, 70] and sizes.records == 96
    # the 90th percentile of the clipped mass (100) lies in the 16-31 bin
    assert sizes.max_words() == 32
    noisy[1, 5] = 40
    assert Sizes.of(noisy).max_words() == 128
    assert Sizes.of(np.full((1, N_BINS), -1.0)).max_words() == 64  # no positive mass
    assert tokens_for(32) == math.ceil(32 * 1.5) + 8 and tokens_for(10_000) == 1024


def _shard(labels: list[int], texts: list[str], users: list[str] | None) -> Shard:
    rows = np.arange(len(labels))
    return Shard(0, 1, rows=rows, buckets=np.zeros(len(labels), np.int64),
                 users=None if users is None else np.asarray(users),
                 labels=lambda: np.asarray(labels),
                 text=lambda: TextShard(texts, {}, rows, np.zeros(len(labels), np.int64)))


def test_the_length_histogram_has_sensitivity_one_per_record_and_per_user() -> None:
    texts = ["short one", "w " * 20, "w " * 20, "w " * 200, "two words"]
    labels = [0, 1, 1, 0, 1]
    exact = finish(sum_partials([label_length_partial(_shard(labels, texts, None), 2)]),
                   2 * N_BINS, 1.0).reshape(2, N_BINS)
    assert exact[0, 0] == 1 and exact[1, 3] == 2 and exact[0, 6] == 1 and exact[1, 0] == 1
    assert exact.sum() == 5
    users = ["a", "a", "a", "b", "c"]  # user a holds three records in two cells
    per_user = label_length_partial(_shard(labels, texts, users), 2)
    total = np.zeros(2 * N_BINS)
    for vec in per_user.buckets.values():
        total += vec
    # user a's contribution (0,0): 1, (1,3): 2, scaled to norm 1; b and c one each
    a = np.zeros(2 * N_BINS)
    a[0], a[N_BINS + 3] = 1, 2
    a /= np.linalg.norm(a)
    expected = a.copy()
    expected[6] += 1
    expected[N_BINS] += 1
    assert np.allclose(total, expected, atol=1e-9)


# ------------------------------------------------------------------ the voting population


def _config(tmp_path: Path, rows: int = 61, **over: Any) -> Any:
    data = write_csv(tmp_path / "d.csv", private_rows(rows))
    return parse_config(pe_config("aug_pe", data, **{"synthesis.population": None, **over}))


def _plan(cfg, method, records: int, labels: int, sigma: float) -> RunPlan:
    """The vote plan the run makes (plan_pe) on these facts, at noise multiplier ``sigma``."""
    plan = plan_pe(method, cfg, PlanInputs(records, labels, sigma=sigma)).votes
    assert plan is not None
    return plan


def test_the_automatic_population_gives_each_candidate_twice_the_noise(tmp_path) -> None:
    cfg = _config(tmp_path, **{"synthesis.samples": 200, "synthesis.pool_multiplier": 3})
    method = get_method("aug_pe")
    shape = method.votes(cfg, 3)
    n = auto_population(cfg, shape, 2000, 3, 1.88)
    assert n == math.floor(2000 / (3 * VOTE_MARGIN * 1.88)) == 177
    expected = 2000 / (3 * n)
    assert expected >= VOTE_MARGIN * 1.88 > 2000 / (3 * (n + 1)) * 0.99
    assert auto_population(cfg, shape, 20, 3, 1.88) == 3  # at least one a label class
    assert auto_population(cfg, shape, 10**7, 3, 1.88) == 200  # at most the release
    assert voting_population(cfg, shape, 2000, 3, 1.88) == 177
    pinned = _config(tmp_path, **{"synthesis.samples": 200, "synthesis.population": 500})
    assert voting_population(pinned, method.votes(pinned, 3), 2000, 3, 1.88) == 200
    wasp = get_method("wasp").votes(cfg, 3)
    assert voting_population(cfg, wasp, 2000, 3, 1.88) == 200  # WASP: samples


def test_a_population_below_the_margin_is_warned_about(tmp_path) -> None:
    method = get_method("aug_pe")
    thin = _config(tmp_path, **{"synthesis.samples": 500, "synthesis.population": 400,
                                "synthesis.pool_multiplier": 3})
    plan = _plan(thin, method, 2000, 3, 1.0)  # expected 2000 / 1200 = 1.67, noise 1
    assert plan.verdict == "thin" and "below the margin of 2x" in plan.message
    assert "synthesis.population" in plan.message
    auto = _plan(_config(tmp_path, **{"synthesis.samples": 500,
                                         "synthesis.pool_multiplier": 3}), method, 2000, 3, 1.0)
    assert auto.verdict == "ok" and auto.population == 333 and auto.samples == 500


def test_the_plan_says_when_the_release_is_drawn_from_few_winners(tmp_path) -> None:
    """200 texts from a population of 30 (epsilon 1 on the small Banking77 job) is more than
    FEW_WINNERS texts a winner: the plan says so, before the verdict's line; from 177 it is
    silent."""
    method = get_method("aug_pe")
    cfg = _config(tmp_path, **{"synthesis.samples": 200, "synthesis.pool_multiplier": 3})
    few = _plan(cfg, method, 500, 3, 6.46)
    assert few.population * FEW_WINNERS < 200
    assert f"200 texts drawn from the {few.population} winners" in few.release_note
    assert few.lines()[-2].strip() == few.release_note  # the message stays the last line
    many = _plan(cfg, method, 2000, 3, 1.88)
    assert many.population == 177 and many.release_note == ""
    assert all("winners of the last vote" not in line for line in many.lines())
    wasp = get_method("wasp")  # WASP releases every round's samples, not winners' variations
    data = write_csv(tmp_path / "w.csv", private_rows(61))
    wcfg = parse_config(pe_config("wasp", data, **{"synthesis.samples": 200,
                                                   "synthesis.population": None}))
    sized = _plan(wcfg, wasp, 150, 3, 6.46)
    assert sized.population * FEW_WINNERS < 200 and sized.release_note == ""


def test_the_plan_says_when_the_release_has_few_texts_a_label_value(tmp_path) -> None:
    """Fewer than FEW_TEXTS_A_VALUE texts a value of the widest label column: the plan says
    the release's size holds a classifier back and what raises it; at that many it is
    silent."""
    method = get_method("aug_pe")
    values = [f"intent_{i}" for i in range(77)]
    cfg = _config(tmp_path, **{"synthesis.samples": 500, "data.label_values": {"label": values}})
    few = _plan(cfg, method, 2000, 77, 1.88)
    assert "500 texts over 77 values of 'label' is 6.49 a value" in few.size_note
    assert "synthesis.samples" in few.size_note and f"  {few.size_note}" in few.lines()
    enough = _config(tmp_path, **{"synthesis.samples": FEW_TEXTS_A_VALUE * 77,
                                  "data.label_values": {"label": values}})
    assert _plan(enough, method, 2000, 77, 1.88).size_note == ""
    three = _config(tmp_path, **{"synthesis.samples": 500})  # 3 declared values
    assert _plan(three, method, 2000, 3, 1.88).size_note == ""


def test_wasps_plan_counts_the_pool_its_last_vote_sees(tmp_path) -> None:
    """WASP has no pool multiplier: vote t is on rounds 0..t, and the last of the T + 1
    rounds is written after the last vote (200 samples, T = 2: 134 candidates voted), or on
    its voting population drawn from them when that is smaller: sized from the record count
    (2 x the noise, at multiplier 1), or set."""
    wasp = get_method("wasp")
    over = {"synthesis.samples": 200, "synthesis.iterations": 2,
            "synthesis.pool_multiplier": 3, "synthesis.population": None}
    data = write_csv(tmp_path / "d.csv", private_rows(61))
    cfg = parse_config(pe_config("wasp", data, **over))
    plan = _plan(cfg, wasp, 5000, 10, 2.0)  # enough records: every candidate voted on
    assert plan.candidates == plan.population == 134
    assert plan.expected_votes == pytest.approx(5000 * wasp.votes(cfg, 10).mass / 134)
    assert "rounds 0..1 of 200" in plan.message and "pool_multiplier" not in plan.message
    few = _plan(cfg, wasp, 150, 10, 2.0)
    noise = 2.0 * wasp.votes(cfg, 10).noise
    assert few.population == few.candidates == math.floor(
        150 * wasp.votes(cfg, 10).mass / (VOTE_MARGIN * noise)) < 134
    assert few.expected_votes >= VOTE_MARGIN * noise and few.verdict == "ok"
    assert "drawn from the pool" in few.message
    set_ = _plan(parse_config(pe_config("wasp", data, **{**over, "synthesis.population": 40})),
                    wasp, 5000, 10, 2.0)
    assert set_.candidates == 40
    one = parse_config(pe_config("wasp", data, **{**over, "data.label_values":
                                                  {"label": ["billing"]}}))
    assert _plan(one, wasp, 150, 1, 2.0).candidates == 134  # no count to size from
    aug = _plan(_config(tmp_path, **{"synthesis.samples": 200, "synthesis.population": 200,
                                        "synthesis.pool_multiplier": 3}),
                   get_method("aug_pe"), 500, 10, 2.0)
    assert aug.candidates == 600 and "pool_multiplier 3" in aug.message


def test_one_label_with_automatic_sizes_is_charged_for_the_sizes_release(tmp_path) -> None:
    method = get_method("aug_pe")
    one = _config(tmp_path, **{"data.label_values": {"label": ["billing"]}})
    assert method.release_plan(one, 1).noised == 3  # the sizes histogram and two votes
    pinned = _config(tmp_path, **{"synthesis.population": 9, "synthesis.max_words": 20})
    assert method.release_plan(pinned, 1).noised == 2
    events = method.release_plan(one, 1).at(2.0)
    assert [e.name for e in events] == ["label_counts", "votes"]
    assert [e.count for e in events] == [1, 2]


# ------------------------------------------------------------------------------ the release


class _Variations:
    """Generation's variations, recorded: the i-th variation of parent text t is 't #i'."""

    def __init__(self) -> None:
        self.parents: list[str] = []

    def variations(self, pool: Pool, n_each: int, tag: str) -> tuple[Pool, np.ndarray]:
        self.parents += pool.texts
        texts = [f"{t} #{i}" for i, t in enumerate(pool.texts)]
        return Pool(texts, pool.labels.copy(), pool.sources.copy()), np.arange(len(texts))


def test_the_release_is_the_winners_and_their_variations_spread_evenly() -> None:
    winners = Pool(["a0", "a1", "b0"], np.array([0, 0, 1]), np.zeros(3, np.int64))
    gen = _Variations()
    out = release_from_winners(gen, winners, np.array([7, 1]), "release1")  # type: ignore
    assert out.texts[:3] == ["a0", "a1", "b0"]
    assert np.bincount(out.labels).tolist() == [7, 1]
    assert sorted(gen.parents) == ["a0", "a0", "a0", "a1", "a1"]  # 5 more, evenly


class _FailingVariations(_Variations):
    """Every variation of a parent named in ``fails`` is refused (dropped), in the first
    ``rounds`` calls only."""

    def __init__(self, fails: set[str], rounds: int) -> None:
        super().__init__()
        self.fails, self.rounds, self.tags = fails, rounds, []

    def variations(self, pool: Pool, n_each: int, tag: str) -> tuple[Pool, np.ndarray]:
        self.tags.append(tag)
        out, _ = super().variations(pool, n_each, tag)
        keep = [i for i, t in enumerate(pool.texts)
                if len(self.tags) > self.rounds or t not in self.fails]
        return out.take(np.asarray(keep, dtype=np.int64)), np.asarray(keep)


def test_a_variation_refused_on_every_retry_is_made_again_from_the_next_winner() -> None:
    """The release keeps its size: the slots a refused variation left empty are filled in a
    further round from the winners next in turn, with their own tag (their own seeds)."""
    winners = Pool(["a0", "a1", "b0"], np.array([0, 0, 1]), np.zeros(3, np.int64))
    gen = _FailingVariations({"a0"}, rounds=1)
    out = release_from_winners(gen, winners, np.array([7, 2]), "release1")  # type: ignore
    assert np.bincount(out.labels).tolist() == [7, 2]
    assert gen.tags == ["release1", "release1/more1"]
    assert gen.parents == ["a0", "a1", "a0", "a1", "a0", "b0",  # round 0: a0's three fail
                           "a1", "a0", "a1"]  # round 1: the three empty slots, in turn
    always = _FailingVariations({"a0", "a1"}, rounds=99)  # nothing of label 0 passes
    out = release_from_winners(always, winners, np.array([7, 1]), "release1")  # type: ignore
    assert np.bincount(out.labels).tolist() == [2, 1]  # the winners only, after 3 rounds
    assert always.tags == ["release1", "release1/more1", "release1/more2"]


class _FailingZeroShot:
    """RANDOM_API whose label-0 texts are all refused in the first ``rounds`` calls."""

    def __init__(self, rounds: int) -> None:
        self.rounds, self.asked = rounds, []

    def zero_shot(self, per_label: np.ndarray, tag: str) -> Pool:
        self.asked.append((tag, [int(n) for n in per_label]))
        labels = [y for y, n in enumerate(per_label) for _ in range(int(n))
                  if y != 0 or len(self.asked) > self.rounds]
        return Pool([f"{tag} {i}" for i in range(len(labels))], np.asarray(labels, np.int64),
                    np.zeros(len(labels), np.int64))


def test_a_zero_shot_release_keeps_its_size_when_generations_are_refused() -> None:
    from dpsynth.evolution.parts import zero_shot_to_quota

    gen = _FailingZeroShot(rounds=1)
    out = zero_shot_to_quota(gen, np.array([3, 2]), "init")  # type: ignore[arg-type]
    assert np.bincount(out.labels).tolist() == [3, 2]
    assert gen.asked == [("init", [3, 2]), ("init/more1", [3, 0])]  # only the empty slots
    never = _FailingZeroShot(rounds=99)
    out = zero_shot_to_quota(never, np.array([3, 2]), "init")  # type: ignore[arg-type]
    assert np.bincount(out.labels, minlength=2).tolist() == [0, 2]
    assert [t for t, _ in never.asked] == ["init", "init/more1", "init/more2"]


def _run(tmp_path: Path, over: dict[str, Any], gen: Any = None, name: str = "run",
         method: str = "aug_pe") -> Path:
    cfg = pe_config(method, write_csv(tmp_path / "d.csv", private_rows(120)), **over)
    cfg["privacy"]["ledger"] = str(tmp_path / f"{name}.ledger.json")
    return Path(run_generation(parse_config(cfg), tmp_path / name, progress=False,
                               generators=[gen or FakeGenerator("fake-g0")],
                               embedder=FakeEmbedder()))


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_run_votes_on_its_population_and_releases_its_samples(tmp_path) -> None:
    run = _run(tmp_path, {"synthesis.population": None, "synthesis.samples": 30,
                          "privacy.epsilon": 8.0})
    plan = json.loads((run / "private" / "plan.json").read_text())
    stats = _jsonl(run / "stats.jsonl")
    assert stats[0]["candidates"] < 30 * 2  # the votes ran on fewer than the release's pool
    assert stats[0]["candidates"] % 2 == 0  # population x L (L = 2)
    synthetic = _jsonl(run / "release" / "synthetic.jsonl")
    zero_shot = _jsonl(run / "release" / "zero_shot.jsonl")
    assert len(synthetic) == len(zero_shot) == 30  # the release keeps its size
    assert plan["population"] * 2 == plan["candidates"]
    privacy = json.loads((run / "release" / "privacy.json").read_text())
    assert privacy["epsilon"] <= 8.0 + 1e-9
    sigma = calibrate_steps(8.0, 1e-5, 3, kind="rdp")  # sizes + 2 votes, one sigma
    assert privacy["noise_multiplier"] == pytest.approx(sigma, rel=1e-6)


def test_wasp_votes_on_its_population_and_releases_every_round(tmp_path) -> None:
    """WASP's votes are on a sample of the pool sized from the released label counts (the
    run's noisy count, the plan's exact one); its release is still every round's samples,
    and the vote is on the candidates of each label the sample holds."""
    over = {"synthesis.population": None, "synthesis.samples": 60, "privacy.epsilon": 4.0,
            "synthesis.iterations": 2}
    run = _run(tmp_path, over, method="wasp")
    plan = json.loads((run / "private" / "plan.json").read_text())
    stats = _jsonl(run / "stats.jsonl")
    assert plan["population"] < 40 and plan["candidates"] == plan["population"]
    pools = [s["candidates"] for s in stats]  # rounds 0..t of 3 rounds of about 20
    assert pools[0] < pools[1] < 60
    assert stats[-1]["voted"] < pools[1] and abs(stats[-1]["voted"] - plan["population"]) <= 3
    assert all(s["voted"] <= c for s, c in zip(stats, pools, strict=True))
    assert len(_jsonl(run / "release" / "synthetic.jsonl")) == 60
    again = _run(tmp_path, over, method="wasp", name="again")  # seeded: the same sample
    assert (again / "release" / "synthetic.jsonl").read_bytes() == \
        (run / "release" / "synthetic.jsonl").read_bytes()
    every = _run(tmp_path, {**over, "synthesis.population": 60}, method="wasp", name="every")
    assert [s["voted"] for s in _jsonl(every / "stats.jsonl")] == pools


def _cut_at(words: int) -> Any:
    """A generator's output cut mid-sentence: its first ``words`` words end a sentence, the
    rest runs on without one (what a token cap leaves)."""
    def cut(text: str) -> str:
        w = text.rstrip(".").split()
        return " ".join(w[:words]) + ". " + " ".join(w[words:])
    return cut


@pytest.mark.parametrize("method", ["wasp", "secpe"])
def test_texts_cut_by_the_token_cap_are_trimmed_without_a_length_estimate(
        tmp_path, method: str) -> None:
    """WASP and SecPE write up to the generators' token cap with no length estimate: a text
    that reached the words the cap holds (64 tokens: 37 words) and stops mid-sentence is
    released back to its last full sentence; a shorter one as it is."""
    over = {"generators": [{"model": "fake-g0", "max_new_tokens": 64}],
            "synthesis.iterations": 1}
    if method == "secpe":
        over.update({"secpe.secrets": [{"kind": "regex", "pattern": r"ACCT-\d{4}"}],
                     "secpe.clusters": 4, "secpe.clip": 0.5, "secpe.discretization": 1e-2})
    long_run = _run(tmp_path, over, FakeGenerator("fake-g0", words=40, transform=_cut_at(30)),
                    name="long", method=method)
    texts = [r["text"] for r in _jsonl(long_run / "release" / "synthetic.jsonl")]
    assert texts and all(t.endswith(".") and len(t.split()) == 30 for t in texts)
    short_run = _run(tmp_path, over, FakeGenerator("fake-g0", words=20, transform=_cut_at(15)),
                     name="short", method=method)
    texts = [r["text"] for r in _jsonl(short_run / "release" / "synthetic.jsonl")]
    assert texts and all(len(t.split()) == 20 and not t.endswith(".") for t in texts)
    # every released text of the short run stops mid-sentence: the run says so, with what
    # to change; the trimmed run's texts end theirs and it says nothing
    assert "stop mid-sentence" in (short_run / "log.txt").read_text()
    assert "max_new_tokens" in (short_run / "log.txt").read_text()
    assert "stop mid-sentence" not in (long_run / "log.txt").read_text()


def test_a_generator_cap_below_the_length_still_trims(tmp_path) -> None:
    """A generator config's max_new_tokens caps every request whatever the length the run
    writes up to (here 24 tokens: 10 words, under a declared 50): a text that reached it and
    stops mid-sentence is trimmed at the cap's words, not at the longer length's."""
    run = _run(tmp_path, {"synthesis.max_words": 50, "synthesis.iterations": 1},
               FakeGenerator("fake-g0", words=20, transform=_cut_at(15)))
    texts = [r["text"] for r in _jsonl(run / "release" / "synthetic.jsonl")]
    assert texts and all(t.endswith(".") and len(t.split()) == 15 for t in texts)


def test_the_share_of_texts_cut_mid_sentence() -> None:
    assert P.cut_share([]) == 0.0
    assert P.cut_share(["Ends here.", "Asks why?", "Quoted \"end.\"", "Runs on and"]) == 0.25
    assert P.ends_a_sentence("Wow!  ") and not P.ends_a_sentence("Mr")


def test_the_texts_length_comes_from_the_released_histogram(tmp_path) -> None:
    seen: list[int] = []

    class Recording(FakeGenerator):
        def generate(self, requests: Any, **kw: Any) -> Any:
            seen.extend(r.params.max_new_tokens for r in requests)
            return super().generate(requests, **kw)

    _run(tmp_path, {"synthesis.max_words": None, "privacy.epsilon": 8.0,
                    "synthesis.lengths": "longest",
                    "generators": [{"model": "fake-g0"}]}, Recording("fake-g0"))
    # the private rows run to 8-15 words: the 90th percentile's bin ends at 16 (or a
    # neighbouring bin under the noise); every text up to it (lengths: longest)
    assert set(seen) <= {tokens_for(w) for w in (8, 16, 32)} and len(set(seen)) == 1
    seen.clear()
    _run(tmp_path, {"synthesis.max_words": 50, "generators": [{"model": "fake-g0"}]},
         Recording("fake-g0"), name="declared")
    assert set(seen) == {tokens_for(50)}


# ------------------------------------------------------------------------------ the filters


@pytest.mark.parametrize("text", [
    "I'd be happy to assist you with editing personal details? I'm a banking expert.",
    "Hi sir, Please follow these steps: 1. Visit the bank's website.",
    "My card arrived but [...] it does not work.",
    "Please send the card to [Insert address] by Monday.",
    "The answer to this question is that the card arrives in a week.",
    "Answer: the card arrives in a week.",
    "I am a customer of an online bank who is unable to provide direct debit.",
    "If you have any questions, feel free to contact us.",
    "You're welcome. What can I help you with today?",
    "Please do not hesitate. Here is a rewritten message: my card is late.",
    "Dear [BankAccountName], your payment method was not recognised.",
    "We apologise for any inconvenience with your recent cash withdrawal.",
    '<a href="/b-bank/account/details">My balance</a> is wrong after the transfer.',
    "\U0001f4a4\U0001f3a8#SalesBeverage \U0001f38c #Premiendo #Sauce #Sauce #Bars #TheoCubano",
    "2019/3/18 6:30am_001.21 571 x1,282,988 + 63.41 11,283,020 + card",
    "I'm trying to clarify my previous answer. Let's change it. Please send my spare card.",
    "The response you sent was too long. I will keep it in the specified format for my card.",
    "Your review has been reworded to be a short and sweet review of the bistro.",
])
def test_chatter_echoes_placeholders_and_answers_are_refused(text: str) -> None:
    assert P.clean_generation(text, 12, drop_off_task=True,
                              writer="a customer of an online bank") is None


@pytest.mark.parametrize("text", [
    "Where is my new card? It has been two weeks.",
    "Why was I charged a fee for my transfer?",
    "Great tacos, friendly staff. The answer is always yes when they ask about salsa.",
    "I received $20 but I entered $100",
    "My last transfer was declined and the previous one too. Why does this keep happening?",
    "The owner replied to my review within a day and fixed the order. Great service!",
    "Loved the crew on flight 22 @united #happy #travel \U0001f389",
])
def test_records_of_the_task_are_kept(text: str) -> None:
    assert P.clean_generation(text, 12, drop_off_task=True,
                              writer="a customer of an online bank") == text


def test_a_list_of_texts_keeps_its_first_item() -> None:
    """WASP's demonstrations are a list; a model continuing it writes several texts."""
    raw = "- Why was my card payment charged a fee?\n- Another text.\n- And a third."
    assert P.clean_generation(raw, 12, drop_off_task=True) == \
        "Why was my card payment charged a fee?"
    assert P.clean_generation("1. Why was I charged twice?\n2. Next one", 12) == \
        "Why was I charged twice?"
    text = "My card - the new one - was charged twice."  # dashes inside a text stay
    assert P.clean_generation(text, 12) == text


def test_prefixes_are_stripped_and_cut_off_texts_trimmed() -> None:
    assert P.clean_generation("Rephrased question: Where is my card?", 5) == "Where is my card?"
    assert P.clean_generation("Here's a reprise of your question. Text: Where is my card?",
                              5) == "Where is my card?"  # the prompt's cue, repeated
    assert P.clean_generation("Below is the text you requested: Where is my card?",
                              5) == "Where is my card?"
    assert P.clean_generation("Below the cash machine: a card", 5) == \
        "Below the cash machine: a card"  # no "below is": a text's own words
    cut = "My card came last week and it does not work at all. I have tried every shop in my"
    assert P.trim_cut_off(cut, 16) == "My card came last week and it does not work at all."
    early = "My card came. It does not work at all and I have tried every shop in my"
    assert P.trim_cut_off(early, 16) == early  # trimming would drop most of it
    assert P.trim_cut_off("Short and cut", 16) == "Short and cut"  # not at the cap
    whole = "My card came and it does not work at all in any shop I have tried today."
    assert P.trim_cut_off(whole, 16) == whole
    assert P.trim_to_sentence("Short and sound. And cut") == "Short and sound."  # any length
    assert P.trim_to_sentence(early) == early and P.trim_to_sentence(whole) == whole


def test_the_filtered_share_is_in_the_stats_and_mostly_filtered_runs_warn(
        tmp_path, capsys) -> None:
    chatter = FakeGenerator("fake-g0", transform=lambda t: "How can I help you? " + t)
    # a fake that chatters in every answer: everything is refused, the run says so
    run = _run(tmp_path, {"synthesis.retries": 1, "synthesis.samples": 6}, chatter)
    stats = _jsonl(run / "stats.jsonl")
    assert stats[0]["filtered_share_initial"] == 1.0
    assert all(s["filtered_share"] in (0.0, 1.0) for s in stats)
    log = (run / "log.txt").read_text()
    assert "were refused by the filters" in log
    clean = _run(tmp_path, {"synthesis.samples": 6}, name="clean")
    assert _jsonl(clean / "stats.jsonl")[0]["filtered_share_initial"] == 0.0
    assert "were refused by the filters" not in (clean / "log.txt").read_text()


def test_the_short_end_of_the_length_band_comes_from_the_released_lengths() -> None:
    lengths = np.zeros(N_BINS)
    lengths[2:6] = [10, 50, 30, 10]  # bins [8, 16), [16, 32), [32, 64), [64, 128)
    sizes = Sizes.of(lengths[None, :])
    assert sizes.min_words() == 8 and sizes.max_words() == 64  # 10th and 90th percentiles
    first = np.zeros(N_BINS)
    first[0] = 5.0
    assert Sizes.of(first[None, :]).min_words() is None  # no short end below the first bin
    assert Sizes.of(np.full((1, N_BINS), -1.0)).min_words() is None  # no positive mass


@pytest.mark.parametrize(("words", "over", "refused"), [
    (3, {"privacy.epsilon": 8.0}, True),  # records run 8-15 words: the DP short end >= 4
    (12, {"privacy.epsilon": 8.0}, False),
    (12, {"synthesis.min_words": 20, "synthesis.max_words": 40,  # declared, within the cap
          "generators": [{"model": "fake-g0", "max_new_tokens": 64}]}, True),
    (3, {"synthesis.max_words": 40}, False),  # a declared length and no short end
])
def test_texts_below_the_length_band_are_refused_and_regenerated(
        tmp_path, words: int, over: dict[str, Any], refused: bool) -> None:
    # the label check off: this test counts the length band's refusals alone
    run = _run(tmp_path, {"synthesis.retries": 1, "synthesis.samples": 6,
                          "synthesis.label_check": False, **over},
               FakeGenerator("fake-g0", words=words))
    share = _jsonl(run / "stats.jsonl")[0]["filtered_share_initial"]
    assert share == (1.0 if refused else 0.0)
    # the band steers, it never empties the release: after the last retry a short text stays
    released = _jsonl(run / "release" / "synthetic.jsonl")
    assert len(released) == 6 and all(len(r["text"].split()) == words for r in released)


@pytest.mark.parametrize(("cap", "refused"), [(16, False), (64, True)])
def test_a_short_end_the_token_cap_cannot_reach_refuses_nothing(
        tmp_path, cap: int, refused: bool) -> None:
    """A band's short end of 20 words under a generator config's cap of 16 tokens (it holds 5
    words) would refuse every attempt and send each request retries + 1 times for nothing;
    under 64 tokens (37 words) a 3-word text is short: refused, counted as short in the stats
    and named as such in the run's warning."""
    over = {"synthesis.retries": 1, "synthesis.samples": 6, "synthesis.label_check": False,
            "synthesis.min_words": 20, "synthesis.max_words": 40,
            "generators": [{"model": "fake-g0", "max_new_tokens": cap}]}
    run = _run(tmp_path, over, FakeGenerator("fake-g0", words=3))
    stats = _jsonl(run / "stats.jsonl")[0]
    summary = json.loads((run / "release" / "summary.json").read_text())
    assert stats["filtered_share_initial"] == (1.0 if refused else 0.0)
    assert stats["short_share_initial"] == stats["filtered_share_initial"]
    assert summary["retried"] == (summary["requested"] if refused else 0)
    assert summary["short"] == (summary["sent"] if refused else 0)
    assert ("were shorter than the length band" in (run / "log.txt").read_text()) == refused
    assert len(_jsonl(run / "release" / "synthetic.jsonl")) == 6


def test_the_plan_says_when_a_generators_cap_cuts_the_texts_shorter(tmp_path) -> None:
    """The plan shows the length the run writes: a generator whose own max_new_tokens holds
    fewer words than the texts' length is named with the words its cap holds."""
    def config(*caps: int | None) -> Any:
        cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(20)))
        cfg["generators"] = [{"model": f"fake-g{i}", "max_new_tokens": c}
                             for i, c in enumerate(caps)]
        return parse_config(cfg)

    note = generator_caps(config(16, None, 200), 64)
    assert "fake-g0 at 16 tokens (about 5 words)" in note and "fake-g1" not in note
    assert "fake-g2" not in note  # 200 tokens hold 128 words: not shorter
    assert generator_caps(config(None), 64) == ""
    assert generator_caps(config(16), None) == ""  # the length is not known before the run


# ------------------------------------------------------------------ learning from the votes


class _RecordingTrainer:
    """A trainer that records what it is shown and writes a finished (empty) model folder."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, list[Any], Path]] = []
        self.threads: list[int] = []  # torch's thread count each training ran on

    def __call__(self, base: Any, pairs: Any, out: Path, settings: Any, seed: int) -> None:
        import torch

        from dpsynth.evolution.preference import MARKER

        assert 0 <= seed < 2**31  # torch.manual_seed takes it
        self.calls.append((base, list(pairs), out))
        self.threads.append(torch.get_num_threads())
        out.mkdir(parents=True)
        (out / MARKER).write_text("{}")


def _run_learning(tmp_path: Path, trainer: _RecordingTrainer, name: str = "run",
                  resume: bool = False, stop: Any = None) -> Path:
    from dpsynth.hooks import RunHooks

    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", private_rows(120)),
                    **{"synthesis.preference": {"enabled": True, "pairs": 5},
                       "privacy.epsilon": 8.0})
    cfg["privacy"]["ledger"] = str(tmp_path / f"{name}.ledger.json")
    config: Any = tmp_path / name / "config.yaml" if resume else parse_config(cfg)
    return Path(run_generation(config, tmp_path / name, resume=resume, progress=False,
                               generators=[FakeGenerator("fake-g0")],
                               embedder=FakeEmbedder(),
                               hooks=RunHooks(preference_trainer=trainer,
                                              on_checkpoint=stop)))


def test_the_generator_learns_from_released_votes_and_never_sees_a_record(tmp_path) -> None:
    trainer = _RecordingTrainer()
    run = _run_learning(tmp_path, trainer)
    assert len(trainer.calls) == 2  # after each of the two votes
    private = {r["text"] for r in private_rows(120)}
    candidates = {r["text"] for f in (run / "release").rglob("*.jsonl") for r in _jsonl(f)}
    for base, pairs, out in trainer.calls:
        assert base is None and out.parent == run / "private" / "preference"
        assert 0 < len(pairs) <= 5
        for p in pairs:
            assert p.chosen not in private and p.rejected not in private
            assert p.chosen != p.rejected
            prompt = json.dumps(p.prompt)
            assert not any(t in prompt for t in private)  # a public prompt
    # the first vote's pairs are candidates of the initial pool, which release/ does not
    # hold whole; the second's are candidates of iteration 1's pool, released in iter1.jsonl
    iter1 = {r["text"] for r in _jsonl(run / "release" / "iterations" / "iter1.jsonl")}
    assert {p.chosen for p in trainer.calls[1][1]} <= iter1 | candidates
    statement = json.loads((run / "release" / "privacy.json").read_text())
    assert "no private record reached the trainer" in statement["preference_training"]


def test_preference_training_runs_on_every_core_not_the_idle_ones(tmp_path) -> None:
    """DPO runs for minutes: on the generator's configured threads, else every core, never
    the thread count torch was left at by a generator loaded on the idle cores (here 1)."""
    import torch

    from dpsynth.llm.runtime import available_cores

    if available_cores() < 2:
        pytest.skip("one core: nothing to tell apart")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = _RecordingTrainer()
        _run_learning(tmp_path, trainer)
        assert trainer.threads == [available_cores()] * 2
        assert torch.get_num_threads() == 1  # restored after each training
    finally:
        torch.set_num_threads(before)


def test_a_resumed_run_trains_nothing_again(tmp_path) -> None:
    from faults import StopAt

    whole = _RecordingTrainer()
    done = _run_learning(tmp_path, whole, name="whole")
    first = _RecordingTrainer()
    with pytest.raises(KeyboardInterrupt):  # stopped after iteration 1's checkpoint
        _run_learning(tmp_path, first, stop=StopAt(2, "evolution"))
    assert len(first.calls) == 1
    folders = sorted(p.name for p in (tmp_path / "run" / "private" / "preference").iterdir())
    again = _RecordingTrainer()
    run = _run_learning(tmp_path, again, resume=True)
    assert len(again.calls) == 1  # only after the second vote: the first model is loaded
    assert again.calls[0][2].name not in folders
    # the same pairs, models and release as the uninterrupted run
    assert [c[2].name for c in whole.calls] == [first.calls[0][2].name, again.calls[0][2].name]
    assert (run / "release" / "synthetic.jsonl").read_bytes() == \
        (done / "release" / "synthetic.jsonl").read_bytes()


def test_preference_training_autocasts_bf16_only_where_the_cpu_multiplies_it_natively(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """precision 'auto' follows the CPU's native bf16 (emulated bf16 is slower than float32);
    'float32' and 'bf16' are what they say whatever the CPU."""
    from dpsynth.evolution import preference
    from dpsynth.evolution.preference import autocast_bf16

    for native in (True, False):
        monkeypatch.setattr(preference, "bf16_supported", lambda native=native: native)
        assert autocast_bf16("auto") is native
        assert autocast_bf16("float32") is False and autocast_bf16("bf16") is True


@pytest.mark.models
def test_dpo_tunes_the_real_generator_and_the_tuned_model_generates(tmp_path,
                                                                     smollm: Any) -> None:
    """trl's DPO on SmolLM2 (one chat pair, one step: the cost is the real 135M model's
    forward/backward over the pair's tokens), merged, loaded back by the local engine the
    run would use (``engine`` as configured: auto) and generating."""
    from dpsynth.config import PreferenceConfig
    from dpsynth.evolution.preference import (
        MARKER,
        PreferencePair,
        autocast_bf16,
        is_tuned,
        train_dpo,
    )
    from dpsynth.llm import GenerationRequest, SamplingParams, load_generator

    # the session's SmolLM2 generator (read-only: only its float weights' folder is used)
    base = Path(smollm.model_dir)
    prompt = P.render(P.zero_shot_instruction("a question", ""), True, "")
    pairs = [PreferencePair(prompt, "Where is my card?", "Sure! Here is a text.")]
    out = tmp_path / "iter0-g0-test"
    train_dpo(base, pairs, out, PreferenceConfig(enabled=True, batch_size=2), seed=0)
    assert is_tuned(out) and (out / "config.json").is_file()
    marker = json.loads((out / MARKER).read_text())
    assert marker["pairs"] == 1 and marker["bf16"] == autocast_bf16("auto")
    tuned = load_generator({"backend": "local", "model": str(out)})
    text = tuned.generate([GenerationRequest(prompt, SamplingParams(max_new_tokens=4,
                                                                     seed=1))])[0]
    assert isinstance(text, str) and text.strip()


class _CapRecorder(FakeGenerator):
    """Writes as many words as its request's token cap allows (about 1.5 tokens a word, as
    :func:`tokens_for` counts) and records each zero-shot request's cap."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.caps: list[int] = []

    def _text(self, request: Any, occurrence: int) -> str:
        self.n_words = max(3, int((request.params.max_new_tokens - 8) / 1.5))
        prompt = json.dumps(request.prompt)
        if "Rephrase" not in prompt and "Fill in" not in prompt:
            self.caps.append(request.params.max_new_tokens)
        return super()._text(request, occurrence)


@pytest.mark.parametrize("lengths", ["drawn", "longest"])
def test_each_zero_shot_request_draws_its_length_from_the_released_lengths(
        tmp_path, lengths: str) -> None:
    """Records of 8-15 words, with a few of 32-63: with ``lengths: drawn`` most requests are
    capped for 8-15 words and a few for the longer bin; with ``longest`` all for the longest."""
    rows = private_rows(120)
    for i, row in enumerate(rows):
        if i % 10 == 0:
            row["text"] += " and" + " more words" * 15  # 40-odd words
    cfg = pe_config("aug_pe", write_csv(tmp_path / "d.csv", rows),
                    **{"synthesis.population": None, "synthesis.samples": 40,
                       "synthesis.lengths": lengths, "synthesis.label_check": False,
                       "privacy.epsilon": 8.0})
    cfg["privacy"]["ledger"] = str(tmp_path / "ledger.json")
    cfg["generators"] = [{"model": "fake-g0"}]  # no max_new_tokens of its own: the run's
    gen = _CapRecorder("fake-g0")
    run = Path(run_generation(parse_config(cfg), tmp_path / "run", progress=False,
                              generators=[gen], embedder=FakeEmbedder()))
    caps = np.array(gen.caps)
    state = json.loads((run / "private" / "checkpoints" / "evolution.json").read_text())
    mix = state["strategy"]["length_mix"]
    if lengths == "longest":
        assert mix is None and set(caps) == {tokens_for(64)}
        return
    assert len(mix) == 5 and mix[2] > 0.5 and mix[4] > 0  # bins [8,16) mostly; [32,64) some
    assert set(caps) <= {tokens_for(w) for w in (3, 7, 15, 31, 63)}
    assert np.mean(caps == tokens_for(15)) > 0.6 and (caps == tokens_for(63)).any()
    words = [len(r["text"].split()) for r in _jsonl(run / "release" / "synthetic.jsonl")]
    assert np.median(words) <= 16  # the release follows the records' lengths
