"""`pingo simulate`: traces, the submission sequence, the oracle and the engine replay."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
from typer.testing import CliRunner

from pingo.cli import app
from pingo.simulation import bound, foresight, oracle, sequence, simulate, traces
from pingo.workflows import language, provenance

SMALL = (
    "seismology-chameleon-100p-001.json",
    "1000genome-chameleon-2ch-100k-001.json",
    "srasearch-chameleon-10a-001.json",
    "epigenomics-chameleon-hep-1seq-100k-001.json",
)


@pytest.fixture
def small_traces(shared_dir: Path) -> list[Path]:
    return [shared_dir / "traces" / name for name in SMALL]


def test_raw_wfcommons_converts_like_make_workloads(shared_dir: Path) -> None:
    trace = shared_dir / "traces" / SMALL[0]
    script = shared_dir / "bench" / "make_workloads.py"
    converted = subprocess.run(
        [sys.executable, str(script), "wfcommons", str(trace)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    with trace.open() as f:
        ours = traces.wfcommons_to_pingo(json.load(f), trace.stem)
    assert ours == json.loads(converted)


def test_marked_tasks_are_distinct_datasets_and_both_formats_load_alike(
    shared_dir: Path, tmp_path: Path
) -> None:
    raw = shared_dir / "traces" / SMALL[0]
    family = traces.load_family(raw)
    definition = language.parse(family.document)
    dataset_ids = provenance.dataset_ids(definition, "server")
    assert len(set(dataset_ids.values())) == family.action_count == 101
    # The same trace already converted by make_workloads.py loads to the same family.
    with raw.open() as f:
        document = traces.wfcommons_to_pingo(json.load(f), raw.stem)
    converted = tmp_path / raw.name
    converted.write_text(json.dumps(document))
    assert traces.load_family(converted).document == family.document
    with pytest.raises(Exception, match="neither a Pingo workflow"):
        bad = tmp_path / "bad.json"
        bad.write_text("[1, 2]")
        traces.load_family(bad)


def test_zipf_weights_fall_with_rank() -> None:
    weights = sequence.zipf_weights(7, 1.1)
    assert sum(weights) == pytest.approx(1.0)
    assert weights == sorted(weights, reverse=True)
    assert weights[0] / weights[1] == pytest.approx(2**1.1)


def test_sequence_is_seeded_and_perturbations_accumulate(small_traces: list[Path]) -> None:
    families = traces.load_families(small_traces)
    first = sequence.generate(families, 60, seed=7)
    assert first == sequence.generate(families, 60, seed=7)
    assert first != sequence.generate(families, 60, seed=8)
    previous: dict[str, sequence.Submission] = {}
    for sub in first:
        before = previous.get(sub.family)
        if before is None:
            assert sub.version == 0 and sub.perturbed_action is None
        else:
            assert sub.version == before.version + 1
            old = {a["id"]: a for a in before.document["actions"]}
            changed = [a for a in sub.document["actions"] if a != old[a["id"]]]
            assert [a["id"] for a in changed] == [sub.perturbed_action]
            assert changed[0]["command"][:-1] == old[sub.perturbed_action]["command"]
        previous[sub.family] = sub
    # Zipf: the most submitted family is far ahead of the least submitted one.
    counts = Counter(s.family for s in sequence.generate(families, 400, seed=1)).most_common()
    assert counts[0][1] > 3 * counts[-1][1]


def _model(
    index: int, datasets: tuple[str, ...], parents: tuple[tuple[int, ...], ...]
) -> oracle.SubmissionModel:
    children = {p for ps in parents for p in ps}
    leaves = tuple(n for n in range(len(datasets)) if n not in children)
    runtimes = {"a": 100.0, "b": 10.0, "c": 1.0}
    return oracle.SubmissionModel(
        index, "f", datasets, parents, leaves, tuple(runtimes[d[0]] for d in datasets)
    )


def test_oracle_evicts_the_farthest_next_read_counting_hidden_ancestors() -> None:
    chain = ((), (0,), (1,))
    models = [
        _model(0, ("a0", "b0", "c0"), chain),
        _model(1, ("a0", "b0", "c1"), chain),  # c changed: reads b0; a0 is hidden by b0
        _model(2, ("a0", "b2", "c2"), chain),  # b changed: reads a0, b0 is never read again
    ]
    catalog = oracle.Catalog()
    for m in models:
        for n, ds in enumerate(m.datasets):
            catalog.size[ds] = 1 if ds.startswith("c") else 10
            catalog.runtime[ds] = m.runtimes[n]
            catalog.parents[ds] = tuple(m.datasets[p] for p in m.parents[n])
            catalog.family[ds] = "f"
            catalog.last_seen[ds] = m.index
        catalog.leaf.update(m.datasets[n] for n in m.leaves)
    computed, reads = oracle.plan(models[1], {"a0", "b0", "c0"})
    assert [models[1].datasets[n] for n in computed] == ["c1"] and reads == ["b0"]

    replay = oracle._Oracle(models, catalog, budget=11)
    replay.refresh("f", after=-1)
    replay.disk("f").update({"a0", "b0", "c0"})
    replay.stored.update({"a0", "b0"})
    replay.fresh.discard("f")
    replay.refresh("f", after=0)
    assert replay.next_read == {"b0": 1, "a0": 2}
    # a0 is read later than b0 (appearing in submission 1 is not enough: b0 hides it).
    result = oracle.run_oracle(models, catalog, 11)
    assert result.compute_s == pytest.approx(111 + 1 + (1 + 10 + 100))
    assert result.evictions == 4  # a0, then b0, then a0 and b2 (never read again)
    ws = oracle.working_set(models, catalog)
    assert ws.unlimited_compute_s == pytest.approx(111 + 1 + 11)
    assert ws.reusable_bytes == 20  # b0 (read by 1) and a0 (read by 2)
    assert oracle.run_oracle(models, catalog, None).compute_s == ws.unlimited_compute_s


async def test_simulated_storage_keeps_promotion_semantics() -> None:
    storage = simulate.SimulatedStorage()
    staging = storage.staging_path("ab" * 32, "wf", 1, 1)
    storage.write(staging, 500)
    final = storage.path_for("ab" * 32)
    assert await storage.promote(staging, final) == 500
    assert await storage.size(final) == 500 and not await storage.exists(staging)
    storage.write(staging, 500)
    assert await storage.promote(staging, final) == 500  # someone else stored it first
    assert storage.used_bytes == 500 and storage.peak_bytes == 1000
    await storage.remove(final)
    await storage.remove(final)
    assert storage.used_bytes == 0 and not await storage.exists(final)


def thirty_submissions(
    small_traces: list[Path],
) -> tuple[list[sequence.Submission], oracle.WorkingSet]:
    """30 submissions of the small traces (seed 5) and their working set."""
    subs = sequence.generate(traces.load_families(small_traces), 30, seed=5)
    models, catalog = oracle.build_models(subs)
    return subs, oracle.working_set(models, catalog)


async def test_engine_replay_agrees_with_the_model_and_full_capacity_is_unlimited(
    small_traces: list[Path],
) -> None:
    subs, ws = thirty_submissions(small_traces)
    unlimited = await simulate.run_engine(subs, "keep-all", None)
    # The real planner and the oracle's model agree on what reuse saves.
    assert unlimited.compute_s == pytest.approx(ws.unlimited_compute_s)
    assert unlimited.executed_actions == ws.datasets
    assert unlimited.peak_bytes == ws.bytes
    assert ws.no_reuse_compute_s > unlimited.compute_s
    full = await simulate.run_engine(subs, "keep-all", ws.bytes)
    assert full.compute_s == pytest.approx(unlimited.compute_s)
    assert full.evictions == 0
    # A budget whose high water mark fits everything never evicts, whatever the policy.
    lru = await simulate.run_engine(subs, "lru", int(ws.bytes / 0.9) + 1)
    assert lru.compute_s == pytest.approx(unlimited.compute_s) and lru.evictions == 0
    # A tight one does, and costs compute, but never more than no reuse at all.
    tight = await simulate.run_engine(subs, "gdsf", ws.bytes // 10)
    assert tight.evictions > 0
    assert unlimited.compute_s < tight.compute_s <= ws.no_reuse_compute_s
    assert tight.peak_bytes < ws.bytes


async def test_a_budget_just_under_the_working_set_evicts_only_its_excess(
    small_traces: list[Path],
) -> None:
    # The high mark 3% under the working set: a pass frees what is over it (and
    # room for the writes it measured), not 15% of the capacity down to the low
    # mark, which here threw reusable data away (lru recomputed 11% more).
    subs, ws = thirty_submissions(small_traces)
    capacity = int(ws.bytes * 0.97 / 0.9)
    for policy in ("lru", "gdsf"):
        run = await simulate.run_engine(subs, policy, capacity)
        assert 0 < run.evicted_bytes < (0.90 - 0.75) * capacity, policy
        assert run.compute_s <= ws.unlimited_compute_s * 1.001, policy


def _without_timings(document: dict[str, Any]) -> dict[str, Any]:
    for row in document["results"]:
        row.pop("wallSeconds")
    return document


async def test_study_is_deterministic_for_a_seed(small_traces: list[Path]) -> None:
    async def once(seed: int) -> dict[str, Any]:
        result = await simulate.study(
            small_traces,
            submissions=25,
            seeds=[seed],
            policies=["lru", "cost-benefit", "gdsf"],
            capacities=[0.1, 0.3],
        )
        return _without_timings(result.to_json())

    first = await once(11)
    assert first == await once(11)
    assert first != await once(12)
    rows = first["results"]
    assert len(rows) == 6
    for row in rows:
        assert row["unlimitedComputeSeconds"] <= row["computeSeconds"]
        assert row["computeSeconds"] <= row["noReuseComputeSeconds"]
        assert row["unlimitedComputeSeconds"] <= row["oracleComputeSeconds"]
    summary = simulate.summarize(
        (
            await simulate.study(
                small_traces, submissions=25, seeds=[11], policies=["lru", "gdsf"], capacities=[0.1]
            )
        ).results
    )
    lru_rows = [r for r in summary if r.policy == "lru"]
    assert all(r.vs_lru == pytest.approx(1.0) for r in lru_rows)


def test_cli_simulate_prints_json_and_writes_a_plot(
    small_traces: list[Path], tmp_path: Path
) -> None:
    plot = tmp_path / "curves.svg"
    args = ["simulate", "--submissions", "12", "--seed", "3", "--policy", "lru"]
    for trace in small_traces[:2]:
        args += ["--trace", str(trace)]
    args += ["--policy", "gdsf", "--capacity", "0.2", "--capacity", "0.5", "--json"]
    args += ["--plot", str(plot)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    keys = {
        "policy",
        "capacityFraction",
        "computeSeconds",
        "noReuseComputeSeconds",
        "unlimitedComputeSeconds",
        "oracleComputeSeconds",
        "evictions",
        "peakBytes",
    }
    assert len(document["results"]) == 4
    assert all(keys <= set(row) for row in document["results"])
    svg = ElementTree.fromstring(plot.read_text())
    labels = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert {"gdsf", "lru", "oracle (offline)", "lower bound (LP): the floor"} <= set(labels)
    # A saved --json run can be summarized again.
    rows = [simulate.Result.from_json(r) for r in document["results"]]
    assert [r.to_json() for r in rows] == document["results"]
    table = simulate.markdown(rows)
    assert table.count("\n| 20% |") == 2 and "| lru |" in table
    shown = CliRunner().invoke(app, [a for a in args if a != "--json"][:-2])
    assert shown.exit_code == 0 and "gdsf" in shown.stdout
    unknown = CliRunner().invoke(app, [*args[:-3], "--policy", "nope"])
    assert unknown.exit_code == 2 and "unknown retention policy" in unknown.output


def test_the_table_in_the_docs_is_the_saved_run() -> None:
    docs = Path(__file__).resolve().parents[2] / "docs"
    saved = json.loads((docs / "retention-study.json").read_text())
    rows = [simulate.Result.from_json(r) for r in saved["results"]]
    assert simulate.markdown(rows) in (docs / "retention.md").read_text()
    # Every seed's engine replay with unlimited storage matched the planning model.
    for sequence_summary in saved["sequences"]:
        assert sequence_summary["unlimitedComputeSeconds"] == pytest.approx(
            sequence_summary["modelUnlimitedComputeSeconds"]
        )


async def test_every_engine_replay_stays_above_the_lower_bound(small_traces: list[Path]) -> None:
    result = await simulate.study(
        small_traces,
        submissions=25,
        seeds=[5],
        policies=["lru", "gdsf", "most-used:window=5", "adaptive", "lineage"],
        capacities=[0.05, 0.2],
    )
    assert len(result.results) == 10
    for row in result.results:
        assert row.unlimited_compute_s <= row.bound_compute_s + 1e-6
        assert row.bound_compute_s <= row.oracle_compute_s + 1e-6
        assert row.bound_compute_s <= row.compute_s + 1e-6, row.policy
    # At 5% the budget binds: the bound is above unlimited storage, not a restatement of it.
    tight = [r for r in result.results if r.capacity_fraction == 0.05]
    assert all(r.bound_compute_s > r.unlimited_compute_s for r in tight)
    table = simulate.markdown(result.results)
    assert "x bound" in table


async def test_no_policy_goes_under_the_bound_of_what_it_kept_at_boundaries(
    small_traces: list[Path],
) -> None:
    """Every built-in policy, real replays: compute >= the bound reported for the run.

    The engine may keep more than the budget at the end of a submission (the
    loop's passes are throttled, claims hold what a pass chose, `lineage` keeps
    candidates when leaves alone exceed the mark), so a run is bounded with the
    bytes it kept there (docs/retention.md, "A lower bound on any policy"). The
    only runs allowed under the budget's own bound are runs that exceeded it.
    """
    paths = small_traces[:2]
    seeds, fractions = [1, 3], [0.05, 0.2, 0.5]
    # And the option whose keep hook declines datasets: they are recomputed, not free.
    policies = [*simulate.DEFAULT_POLICIES, "lineage:min_share=0.3"]
    result = await simulate.study(
        paths, submissions=10, seeds=seeds, policies=policies, capacities=fractions,
    )  # fmt: skip
    assert len(result.results) == len(seeds) * len(fractions) * len(policies)
    plain: dict[tuple[int, float], float] = {}
    for seed in seeds:
        models, catalog = oracle.build_models(
            sequence.generate(traces.load_families(paths), 10, seed)
        )
        for fraction in fractions:
            budget = int(0.9 * max(1, int(fraction * oracle.working_set(models, catalog).bytes)))
            plain[(seed, fraction)] = bound.lower_bound(models, catalog, budget).compute_s
    under = []
    for r in result.results:
        floor = plain[(r.seed, r.capacity_fraction)]
        assert r.bound_compute_s <= r.compute_s + 1e-6, (r.seed, r.policy, r.capacity_fraction)
        assert r.unlimited_compute_s <= r.bound_compute_s <= floor + 1e-6
        if r.boundary_excess_bytes == 0:
            assert r.bound_compute_s == pytest.approx(floor)
        if r.compute_s < floor - 1e-6:
            # The documented exception, and the only one: the run kept more than the budget.
            assert r.boundary_excess_bytes > 0, (r.seed, r.policy, r.capacity_fraction)
            under.append((r.seed, r.policy, r.capacity_fraction))
    # The red CI case (seed 3, 20%: leaves alone exceed the budget) is one of them:
    # lineage's 4,685 s against the budget's bound of 7,667 s.
    assert (3, "lineage", 0.2) in under


def _pingo(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, its stdout a pipe (as in `pingo simulate | less`)."""
    script = Path(sys.executable).parent / "pingo"
    return subprocess.run(
        [str(script), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_cli_simulate_formats_are_complete_when_piped(small_traces: list[Path]) -> None:
    args = ["simulate", "--submissions", "10", "--seed", "3", "--capacity", "0.2"]
    for trace in small_traces[:2]:
        args += ["--trace", str(trace)]
    args += ["--policy", "lru", "--policy", "most-used:window=4"]
    table = _pingo(*args)
    assert table.returncode == 0, table.stderr
    assert "…" not in table.stdout
    assert "xbound" in table.stdout and "most-used:window=4" in table.stdout
    rows = list(csv.DictReader(io.StringIO(_pingo(*args, "--format", "csv").stdout)))
    assert [r["policy"] for r in rows] == ["lru", "most-used:window=4"]
    assert all(float(r["vs_bound"]) >= 1.0 - 1e-9 for r in rows)
    markdown = _pingo(*args, "--format", "markdown").stdout
    assert markdown.startswith("| capacity | policy |") and markdown.count("\n| 20% |") == 2
    wrong = _pingo(*args, "--format", "xml")
    assert wrong.returncode == 2 and "--format must be" in wrong.stderr


def test_cli_simulate_warns_when_nothing_is_reused(small_traces: list[Path]) -> None:
    # One submission: nothing can be reused, whatever the policy.
    result = _pingo(
        "simulate", "--trace", str(small_traces[0]), "--submissions", "1", "--capacity", "0.5",
        "--policy", "lru", "--format", "csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "warning: no submission reuses" in result.stderr


def test_the_shipped_traces_are_the_shared_ones(shared_dir: Path) -> None:
    shipped = traces.shipped_traces()
    shared = sorted((shared_dir / "traces").glob("*.json"))
    assert [traces.trace_stem(p) for p in shipped] == [p.stem for p in shared]
    # Same families, same marks: a study on either gives the same sequence.
    assert traces.load_families(shipped) == traces.load_families(shared)


def test_the_plot_draws_the_bound_as_the_floor_and_escapes_names() -> None:
    def row(policy: str, fraction: float, compute: float) -> simulate.Result:
        return simulate.Result(
            seed=1, policy=policy, capacity_fraction=fraction, capacity_bytes=1000,
            compute_s=compute, no_reuse_compute_s=600.0, unlimited_compute_s=100.0,
            oracle_compute_s=130.0, bound_compute_s=110.0, evictions=0, oracle_evictions=0,
            peak_bytes=0, executed_actions=0, dropped_new=0, working_set_bytes=0,
            reusable_bytes=0, wall_s=0.0,
        )  # fmt: skip

    evil = "<script>alert(1)</script>&"
    rows = [row(p, f, c) for p in ("lru", evil) for f, c in ((0.05, 200.0), (0.5, 120.0))]
    document = simulate.plot_svg(rows)
    svg = ElementTree.fromstring(document)  # well-formed, whatever the names
    assert "<script>" not in document and evil in [t.text for t in svg.iter(f"{{{SVG}}}text")]
    lines = {
        label: [tuple(map(float, p.split(","))) for p in poly.attrib["points"].split()]
        for label, poly in zip(
            [t.text for t in svg.iter(f"{{{SVG}}}text")][-4:],
            svg.iter(f"{{{SVG}}}polyline"),
            strict=True,
        )
    }
    floor = lines["lower bound (LP): the floor"]
    for label, points in lines.items():
        # SVG's y grows downwards: nothing is drawn under the floor.
        assert all(y <= fy for (_, y), (_, fy) in zip(points, floor, strict=True)), label


SVG = "http://www.w3.org/2000/svg"


def test_cli_simulate_runs_on_the_shipped_traces_by_default() -> None:
    result = _pingo(
        "simulate", "--submissions", "3", "--seed", "2", "--capacity", "0.5",
        "--policy", "lineage", "--format", "csv",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert [r["policy"] for r in rows] == ["lineage"]


async def test_foresight_replays_the_bounds_solution_in_the_engine(
    small_traces: list[Path],
) -> None:
    """The bound's own decisions, run in the engine: never under the bound of what the
    run kept, and with room for everything, nothing is evicted and nothing recomputed."""
    subs = sequence.generate(traces.load_families(small_traces[:2]), 10, 3)
    models, catalog = oracle.build_models(subs)
    ws = oracle.working_set(models, catalog)
    tight = await foresight.replay(subs, 0.8)
    # The solution keeps some intervals and drops others; the replay declines to store
    # what it drops (the keep hook) and evicts at passes.
    dropped = tight.budget_bound.dropped
    assert min(dropped) < 0.5 < max(dropped)
    assert tight.run.dropped_new > 0
    assert tight.run.evictions > 0
    assert tight.own_bound.compute_s <= tight.run.compute_s + 1e-6
    assert tight.own_bound.compute_s <= tight.budget_bound.compute_s + 1e-6
    # Every recompute is accounted for, once, and so is every second the bound charges.
    spent = tight.distance
    recomputed = tight.run.compute_s - ws.unlimited_compute_s
    assert recomputed > 0
    assert spent.kept_s + spent.dropped_s + spent.unplanned_s == pytest.approx(recomputed)
    assert spent.charged_intervals_s + spent.charged_cascades_s == pytest.approx(
        tight.budget_bound.compute_s - ws.unlimited_compute_s
    )
    # Another policy's run, filed against the same solution: the same accounting.
    filed = await foresight.replay(subs, 0.8, policy="lineage")
    assert filed.run.policy == "lineage"
    assert filed.budget_bound.compute_s == tight.budget_bound.compute_s
    spent = filed.distance
    assert spent.kept_s + spent.dropped_s + spent.unplanned_s == pytest.approx(
        filed.run.compute_s - ws.unlimited_compute_s
    )
    assert filed.run.compute_s > ws.unlimited_compute_s and spent.passes_into_kept is None
    roomy = await foresight.replay(subs, 2.0)
    assert roomy.run.evictions == 0
    assert roomy.run.compute_s == pytest.approx(ws.unlimited_compute_s)
    assert roomy.distance == foresight.Distance(0.0, 0.0, 0.0, 0.0, 0.0, 0, 0)
