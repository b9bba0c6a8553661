"""The tuner's CPU-side promises: pruning, strategies, the results database, winners as specs."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
from pathlib import Path

import pytest

from gemmgen.tuning import strategies
from gemmgen.library.emit import dispatcher_header_source, dispatcher_source
from gemmgen.plan import make_plan
from gemmgen.plan.space import describe, expand, point_key, to_text
from gemmgen.language.load import load_one, parse
from gemmgen.tuning.database import db_scope, load_records
from gemmgen.tuning.tune import best_recorded, summarize
from gemmgen.gpu.verify import Case

SPECS = Path(__file__).resolve().parent.parent / "specs"


@pytest.fixture(scope="module")
def hopper_space():
    return expand(load_one(SPECS / "hopper_search.gemm"))


def test_pruning_reports_total_valid_and_reasons(hopper_space):
    assert hopper_space.total == 9216
    assert 0 < hopper_space.valid < hopper_space.total
    assert sum(hopper_space.pruned.values()) + hopper_space.valid <= hopper_space.total
    assert any("warp has" in reason for reason in hopper_space.pruned)
    for plan in hopper_space.plans[:50]:
        assert plan.threads <= 1024 and plan.smem_bytes <= plan.arch.smem_per_block


def test_every_valid_point_plans_and_every_pruned_one_does_not():
    spec = parse("kernel s { block {64, 96} x 64 x 8; thread {8, 3} x 8 }")[0]
    space = expand(spec)
    assert space.total == 4 and space.dimensions == [[64, 96], [8, 3]]
    # 64/8 and 96/3 rows per thread work; 64 is no multiple of 3, and 96 x 64 / 8 x 8 makes 96
    # threads, which cannot share B's 8 x 64 tile evenly.
    assert space.valid_points == [(64, 8), (96, 3)]
    assert sum(space.pruned.values()) == 2


def synthetic(space, seed):
    """A smooth landscape over the set indices with a little noise: a stand-in for TFLOP/s."""
    rng = random.Random(seed)
    optimum = [rng.randrange(len(values)) for values in space.dimensions]
    weights = [rng.uniform(0.5, 3.0) for _ in space.dimensions]
    noise = {p: rng.uniform(-0.3, 0.3) for p in space.valid_points}

    def score(point):
        distance = sum(w * (values.index(v) - o) ** 2
                       for v, values, o, w in zip(point, space.dimensions, optimum, weights))
        return max(0.1, 45.0 - distance + noise[point])
    return score


class Counting:
    def __init__(self, score, budget=None):
        self.score, self.budget, self.calls, self.seen = score, budget, 0, set()

    def __call__(self, points):
        fresh = [p for p in points if p not in self.seen]
        if self.budget is not None and len(self.seen) + len(fresh) > self.budget:
            fresh = fresh[: self.budget - len(self.seen)]
            self.seen.update(fresh)
            raise strategies.Budget()
        self.seen.update(fresh)
        return [self.score(p) for p in points]


def run(name, space, evaluate, **options):
    module = strategies.get(name)
    try:
        module.tune(space, evaluate, strategies.options_with_defaults(module, options))
    except strategies.Budget:
        pass


def test_exhaustive_visits_every_valid_point_once(hopper_space):
    evaluate = Counting(synthetic(hopper_space, 0))
    run("exhaustive", hopper_space, evaluate)
    assert evaluate.seen == set(hopper_space.valid_points)


def test_random_sample_respects_the_budget_and_draws_valid_points(hopper_space):
    evaluate = Counting(synthetic(hopper_space, 1), budget=100)
    run("random_sample", hopper_space, evaluate, seed=3)
    assert len(evaluate.seen) == 100
    assert evaluate.seen <= set(hopper_space.valid_points)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_model_gets_within_3_percent_of_the_best_with_a_tenth_of_the_points(hopper_space, seed):
    score = synthetic(hopper_space, seed)
    best = max(score(p) for p in hopper_space.valid_points)
    evaluate = Counting(score, budget=len(hopper_space.valid_points) // 10)
    evaluate.shape = Case(4096, 4096, 4096)   # the model strategy derives its features at the shape
    run("model", hopper_space, evaluate, seed=seed)
    found = max(score(p) for p in evaluate.seen)
    assert found >= 0.97 * best, (found, best)


def test_unknown_strategy_and_option_are_named():
    with pytest.raises(ValueError, match="unknown strategy 'annealing'.*model"):
        strategies.get("annealing")
    with pytest.raises(ValueError, match="no option.*popsize.*explore"):
        strategies.options_with_defaults(strategies.get("model"), {"popsize": 3})


def _write_db(path, scope, records):
    with path.open("w") as handle:
        for record in records:
            handle.write(json.dumps({"scope": scope, **record}) + "\n")


def test_database_resumes_ignoring_a_line_cut_short(tmp_path):
    db = tmp_path / "tune.jsonl"
    scope = db_scope("GPU", "13.0", Case(64, 64, 64), "s")
    _write_db(db, scope, [{"key": "a", "status": "ok", "ms": 2.0, "tflops": 1.0},
                          {"key": "b", "status": "crash", "reason": "died"}])
    with db.open("a") as handle:
        handle.write('{"scope": "' + scope + '", "key": "c", "sta')  # interrupted mid-write
    records = load_records(db, scope)
    assert set(records) == {"a", "b"}
    assert load_records(db, "another scope") == {}


def test_best_recorded_point_rebuilds_the_same_kernel(tmp_path):
    spec = load_one(SPECS / "hopper_refine.gemm")
    space = expand(spec)
    plans = space.plans[:3]
    db = tmp_path / "tune.jsonl"
    scope = db_scope("GPU", "13.0", Case(4096, 4096, 4096), spec.name)
    _write_db(db, scope, [{"key": point_key(p.spec), "status": "ok", "ms": 1.0, "tflops": t, "point": ""}
                          for p, t in zip(plans, (10.0, 30.0, 20.0))]
              + [{"key": point_key(plans[0].spec), "status": "invalid", "tflops": 99.0}])
    plan, record = best_recorded(spec, db)
    assert plan.spec == plans[1].spec and record["tflops"] == 30.0
    result = summarize(space, Case(4096, 4096, 4096), db, scope)
    assert result.best_plan.spec == plans[1].spec
    with pytest.raises(LookupError, match="run gemmgen tune first"):
        best_recorded(spec, db, Case(1, 2, 3))


@pytest.mark.parametrize("space", ["hopper_refine", "skinny_tc_search", "hopper_tc_search", "hopper_frontier_search"])
def test_a_winner_written_as_spec_text_parses_back_to_the_same_point(space):
    for plan in expand(load_one(SPECS / f"{space}.gemm")).plans[::37]:
        text = to_text(plan.spec, plan.name, "a comment")
        again = parse(text)[0]
        assert make_plan(again).smem_bytes == plan.smem_bytes
        for key in plan.spec.params:
            assert again[key] == plan.spec[key], key


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_dispatcher_holds_every_winner_behind_one_entry_point(tmp_path):
    """Each distinct winner once, with a static launcher: the entry point and its strided batches'
    are the file's only symbols."""
    winners = [(Case(4096, 4096, 4096), make_plan(load_one(SPECS / "hopper_simt.gemm"))),
               (Case(1024, 1024, 1024), make_plan(load_one(SPECS / "warptile.gemm"))),
               (Case(2048, 2048, 2048), make_plan(load_one(SPECS / "hopper_simt.gemm")))]  # won twice
    source = dispatcher_source("tuned", winners)
    path = tmp_path / "tuned.cu"
    path.write_text(source)
    # Its header first: a prototype that differs from the definition would not compile.
    (tmp_path / "tuned.h").write_text(dispatcher_header_source("tuned", winners, "tuned.cu"))
    subprocess.run(["nvcc", "-c", "-arch=sm_90", "-std=c++17", "-include", str(tmp_path / "tuned.h"),
                    "-o", str(tmp_path / "t.o"), str(path)], check=True, capture_output=True)
    symbols = subprocess.run(["nm", str(tmp_path / "t.o")], capture_output=True, text=True).stdout
    exported = [line.split()[-1] for line in symbols.splitlines() if " T " in line]
    assert exported == ["gemmgen_tuned", "gemmgen_tuned_batched"]
    assert source.count("// ==== member") == 2 and "static int gemmgen_tuned_0(" in source
    with pytest.raises(ValueError, match="share layouts"):
        col = make_plan(load_one(SPECS / "warptile.gemm").with_values(layout_A="col"))
        dispatcher_source("mixed", [winners[0], (Case(1, 1, 1), col)])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_a_dispatcher_over_fused_epilogues_passes_their_vectors_to_each_winner(tmp_path):
    """Winners with a bias take it in the entry point, after ldc (before the batch in the batched
    one), and hand it to the kernel chosen; winners whose epilogues differ cannot share one entry
    point."""
    fused = make_plan(load_one(SPECS / "epilogue_naive.gemm"))
    winners = [(Case(4096, 4096, 4096), fused), (Case(64, 64, 64), fused)]
    source = dispatcher_source("fused", winners)
    header = dispatcher_header_source("fused", winners, "fused.cu")
    assert "int ldc, const float *bias, cudaStream_t stream" in header
    assert " ".join(header.split()).count("int ldc, const float *bias, int batch, long long strideA, long long "
                                          "strideB, long long strideC, cudaStream_t stream);") == 1
    assert ("gemmgen_fused_0_batched(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, batch, strideA, strideB, "
            "strideC, stream)") in source
    assert "return gemmgen_fused_batched(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, bias, 1, 0, 0, 0, stream)" \
        in source
    (tmp_path / "fused.cu").write_text(source)
    (tmp_path / "fused.h").write_text(header)
    subprocess.run(["nvcc", "-c", "-arch=sm_90", "-std=c++17", "-include", str(tmp_path / "fused.h"),
                    "-o", str(tmp_path / "f.o"), str(tmp_path / "fused.cu")], check=True, capture_output=True)
    with pytest.raises(ValueError, match="share layouts, epilogue"):
        naive = make_plan(load_one(SPECS / "naive.gemm"))
        dispatcher_source("mixed", [(Case(64, 64, 64), fused), (Case(1, 1, 1), naive)])


def test_the_dispatcher_runs_the_kernel_tuned_for_the_nearest_shape(tmp_path):
    """The .cu's choice, compiled for the host and run: each call goes to the winner of the shape
    nearest in log M, log N, log K."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no host C++ compiler")
    simt, warptile = make_plan(load_one(SPECS / "hopper_simt.gemm")), make_plan(load_one(SPECS / "warptile.gemm"))
    winners = [(Case(4096, 4096, 4096), simt), (Case(64, 64, 64), warptile), (Case(127, 4099, 1023), simt)]
    source = dispatcher_source("tuned", winners)
    start = source.index("namespace gemmgen_tuned_choice {")
    end = source.index("}  // namespace gemmgen_tuned_choice", start)
    program = tmp_path / "choose.cpp"
    program.write_text("#include <math.h>\n#include <stdio.h>\n" + source[start:end] + "}\n" + """
int main() {
    int M, N, K;
    while (scanf("%d %d %d", &M, &N, &K) == 3) printf("%d\\n", gemmgen_tuned_choice::choose(M, N, K));
}
""")
    subprocess.run([compiler, "-O1", "-o", str(tmp_path / "choose"), str(program)], check=True)
    calls = [(4096, 4096, 4096), (3000, 3000, 3000), (64, 64, 64), (1, 1, 1), (100, 5000, 1000), (0, 0, 0)]
    out = subprocess.run([str(tmp_path / "choose")], input="\n".join(f"{M} {N} {K}" for M, N, K in calls),
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "0", "1", "1", "0", "1"]


def test_build_takes_the_best_recorded_point_of_a_search_space(tmp_path):
    from click.testing import CliRunner

    from gemmgen.cli import main

    spec = load_one(SPECS / "hopper_refine.gemm")
    plans = expand(spec).plans[:2]
    db = tmp_path / "tune.jsonl"
    scope = db_scope("NVIDIA H100", "13.0", Case(4096, 4096, 4096), spec.name)
    _write_db(db, scope, [{"key": point_key(p.spec), "status": "ok", "ms": 1.0, "tflops": t,
                           "point": describe(p.spec)} for p, t in zip(plans, (5.0, 7.0))])
    out = tmp_path / "best.cu"
    result = CliRunner().invoke(main, ["build", str(SPECS / "hopper_refine.gemm"), "--from-db", str(db),
                                       "--shape", "4096x4096x4096", "-o", str(out), "--no-compile"])
    assert result.exit_code == 0, result.output
    assert f"best recorded point {describe(plans[1].spec)} (7.00 TFLOP/s" in result.output
    from gemmgen.codegen.cuda import generate
    assert out.read_text() == generate(plans[1])
    missing = CliRunner().invoke(main, ["build", str(SPECS / "hopper_refine.gemm"), "--from-db", str(db),
                                        "--shape", "64x64x64", "-o", str(out)])
    assert missing.exit_code == 1 and "run gemmgen tune first" in missing.output


def test_compile_cache_serves_a_second_compile_without_nvrtc(tmp_path, monkeypatch):
    from gemmgen.gpu import compile as compile_mod

    monkeypatch.setenv("GEMMGEN_CACHE", str(tmp_path))
    plan = make_plan(load_one(SPECS / "naive.gemm"))
    first = compile_mod.compile_plan(plan)

    def no_nvrtc(*args, **kwargs):
        raise AssertionError("NVRTC was called for a cached kernel")

    real = compile_mod._nvrtc
    monkeypatch.setattr(compile_mod, "_nvrtc", lambda: type("N", (), {
        "nvrtcVersion": staticmethod(real().nvrtcVersion),
        "nvrtcCreateProgram": staticmethod(no_nvrtc)})())
    second = compile_mod.compile_plan(plan)
    assert second.cubin == first.cubin and second.lowered_names == first.lowered_names
    assert second.resources == first.resources
    changed = make_plan(load_one(SPECS / "naive.gemm").with_values(target="sm_80"))
    with pytest.raises(AssertionError, match="NVRTC was called"):
        compile_mod.compile_plan(changed)  # another target is another key


# --- the baseline follows the space's precision ------------------------------------------------

def _space(math_line: str):
    from gemmgen.plan.space import expand
    (spec,) = parse("kernel s {\n  block {64, 128} x 64 x 32\n  warp 32 x 32\n  " + math_line + "\n}\n", "s.gemm")
    return expand(spec)


def test_a_search_is_timed_against_cublas_in_its_own_precision():
    from gemmgen.tuning.measure import search_baseline
    assert search_baseline(_space("math tf32")) == "cuBLAS TF32"
    assert search_baseline(_space("math 3xtf32")) == "cuBLAS FP32"


def test_a_search_mixing_tf32_with_fp32_accurate_math_is_refused_at_the_math_line():
    from gemmgen.language.errors import SpecError
    from gemmgen.tuning.measure import search_baseline
    with pytest.raises(SpecError) as info:
        search_baseline(_space("math {tf32, 3xtf32}"))
    assert (info.value.line, info.value.column) == (4, 8)
    assert "mixes TF32" in info.value.message and "one search per precision" in info.value.allowed
