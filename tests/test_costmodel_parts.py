"""The numbers of schedules, clusters and epilogues for cost models (gemmgen/tuning/costparts.py), and
leave-one-recording-out replays (gemmgen/tuning/replay.py)."""

from __future__ import annotations

import pytest

from gemmgen.language.load import parse
from gemmgen.plan import make_plan
from gemmgen.plan.parts.epilogue import ACTIVATIONS
from gemmgen.tuning.costparts import activation_ops, epilogue_traffic, multicast_saving, waves

TC = "kernel t { target sm_90a; layout A row, B col, C row; block 128 x 256 x 32; math tf32; stages 4 tma%s }"


def _plan(extra: str = "", block: str = "128 x 256"):
    return make_plan(parse((TC % extra).replace("128 x 256", block))[0])


def test_data_parallel_waves_count_tiles_over_the_sms_and_the_last_waves_fill():
    w = waves(_plan(), 4096, 4096, 4096, 132)
    # 32 x 16 = 512 tiles on 132 SMs: 3 whole waves and one of 116 tiles
    assert (w.per_sm, w.fill, w.last_fill) == (4, pytest.approx(512 / 528), pytest.approx(116 / 132))
    assert waves(_plan(), 128 * 12, 256 * 11, 4096, 132).last_fill == 1.0   # 132 tiles: one whole wave


def test_persistent_clusters_walk_cluster_tiles_and_leave_the_odd_sm_idle():
    plain = waves(_plan("; schedule persistent"), 4096, 4096, 4096, 132)
    assert (plain.per_sm, plain.last_fill) == (4, pytest.approx(116 / 132))
    # 2 x 1 clusters: 256 cluster tiles walked by 66 clusters, 58 of them in the last wave
    clustered = waves(_plan("; schedule persistent; cluster 2 x 1"), 4096, 4096, 4096, 132)
    assert (clustered.per_sm, clustered.last_fill) == (4, pytest.approx(58 / 66))
    assert clustered.fill == pytest.approx(256 / (66 * 4))
    # 131 SMs: 65 clusters of 2, one SM never used
    assert waves(_plan("; schedule persistent; cluster 2 x 1"), 4096, 4096, 4096, 131).fill \
        == pytest.approx(256 / (65 * 4) * 130 / 131)


def test_stream_k_deals_the_last_wave_so_it_is_full():
    w = waves(_plan("; schedule stream-k", "128 x 128"), 8192, 128, 8192, 132)
    assert w.fill > 0.99 and w.last_fill == 1.0
    data_parallel = waves(_plan("", "128 x 128"), 8192, 128, 8192, 132)
    assert data_parallel.fill == pytest.approx(64 / 132)


def test_multicast_saves_the_shared_operands_l2_reads():
    assert multicast_saving(_plan("", "128 x 128")) == 0.0
    # 2 x 1: the two blocks of a cluster column share B's tile: 128 of 256 rows read once for two
    assert multicast_saving(_plan("; cluster 2 x 1", "128 x 128")) == pytest.approx(0.25)
    assert multicast_saving(_plan("; cluster 2 x 2", "128 x 128")) == pytest.approx(0.5)



def test_activation_ops_count_operators_and_special_functions():
    assert activation_ops(ACTIVATIONS["none"].cuda) == 0
    assert activation_ops(ACTIVATIONS["relu"].cuda) == 1
    assert activation_ops(ACTIVATIONS["gelu"].cuda) == 4 + 8          # 3 products, a sum, erff
    assert activation_ops(ACTIVATIONS["silu"].cuda) == 3 + 8          # -x, 1 + e, x / (...), expf
    assert activation_ops(ACTIVATIONS["gelu_tanh"].cuda) > activation_ops(ACTIVATIONS["gelu"].cuda)


def test_epilogue_traffic_counts_c_betas_read_the_vectors_and_a_staged_pass():
    area = 128 * 256
    plain = epilogue_traffic(_plan("; epilogue alpha"))   # C not read
    assert (plain.global_bytes, plain.shared_bytes, plain.ops_per_element) == (4 * area, 0, 1)
    beta = epilogue_traffic(_plan())   # alpha and beta, the default
    assert (beta.global_bytes, beta.ops_per_element) == (8 * area, 3)
    fused = epilogue_traffic(_plan("; bias col; scale row; activation gelu"))
    assert fused.global_bytes == 8 * area + 4 * 256 + 4 * 128
    assert fused.ops_per_element == 3 + 2 + 12
    staged = epilogue_traffic(_plan("; epilogue alpha staged", "128 x 128"))
    assert staged.shared_bytes == 8 * 128 * 128




def test_leave_one_out_chooses_on_the_other_recordings_only(monkeypatch):
    """Each recording is judged with the choice that did best on the others: a choice that is best
    only on the recording left out is never picked for it."""
    from types import SimpleNamespace

    from gemmgen.tuning import replay as replay_module

    # evaluations to within 3% (and 1%) by (recording, choice), out of 100 valid points
    medians = {("a", 0): 1, ("a", 1): 50, ("b", 0): 40, ("b", 1): 10, ("c", 0): 30, ("c", 1): 20}
    recordings = [SimpleNamespace(label=name) for name in "abc"]

    def fake_replay(name, recording, seeds, options, jobs=1):
        n = medians[(recording.label, options["dram"])]
        return SimpleNamespace(valid=100, median=lambda within: n, label=recording.label)

    monkeypatch.setattr(replay_module, "replay", fake_replay)
    folds = replay_module.leave_one_out("model", recordings, [{"dram": 0}, {"dram": 1}], seeds=1)
    # a: b and c prefer choice 1 (10 + 20 < 40 + 30), though a itself does best with choice 0;
    # b: a and c prefer 0 (1 + 30 < 50 + 20), though b does best with 1; c: a and b prefer 0
    assert [f.options["dram"] for f in folds] == [1, 0, 0]
    assert folds[0].outcome.median(0.03) == 50
    assert folds[0].costs == pytest.approx([2 * (0.4 + 0.3), 2 * (0.1 + 0.2)])
    with pytest.raises(ValueError, match="at least two recordings"):
        replay_module.leave_one_out("model", recordings[:1], [{"dram": 0}])
