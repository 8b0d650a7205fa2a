"""The time side of the estimate: device catalog, link model, per-layout step terms, calibration."""

from __future__ import annotations

import json

import pytest

from trainlab.config.convert import compose_run_config
from trainlab.config.layout_types import bubble_fraction
from trainlab.estimate.calibration import Calibration, load_calibration
from trainlab.estimate.hardware import hardware
from trainlab.estimate.links import Link, all_gather_s, all_reduce_s
from trainlab.estimate.rank_layout import Layout
from trainlab.estimate.shape import model_shape
from trainlab.estimate.timing import rank_times, step_terms
from trainlab.models.accounting import count_params
from trainlab.plan.derive_layout import plan_layout
from trainlab.vocab.gpus import GPUS
from trainlab.vocab.nodes import ClusterSpec

BIG = ["model=7b", "train.seq_len=2048", "train.micro_batch_size=1", "train.global_batch_size=16"]


def times(overrides: list[str], cluster: ClusterSpec, cal: Calibration | None = None):
    run = compose_run_config(overrides)
    layout = Layout.of(run, cluster, plan_layout(run))
    terms = step_terms(run, layout=layout)
    return layout, terms, rank_times(terms, calibration=cal or Calibration())


def step(overrides, cluster, cal=None) -> float:
    return max(t.step_s for t in times(overrides, cluster, cal)[2])


# --- hardware ---------------------------------------------------------------------------------
def test_gpu_peaks_are_the_mfu_tables():
    table = {g.label: g.peak_tflops for g in GPUS}
    assert hardware("H100").peak_tflops("bf16") == table["H100 SXM"]["bf16"]
    assert hardware("H100").peak_tflops("fp8") == table["H100 SXM"]["fp8"]
    assert hardware("A100").peak_tflops("fp8") is None  # no FP8 tensor cores: unknown, not guessed
    assert hardware("H200").memory_gb > hardware("H100").memory_gb


def test_unknown_gpu_type_is_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"cluster.nodes.*'H1OO'.*H100"):
        hardware("H1OO")


def test_cpu_has_a_probed_peak_and_no_fp8():
    cpu = hardware("cpu")
    assert cpu.peak_tflops("fp32") > 0 and cpu.peak_tflops("fp8") is None and cpu.memory_gb > 1


# --- links ------------------------------------------------------------------------------------
def test_ring_all_reduce_moves_twice_the_buffer_for_large_messages():
    link = Link("nvlink", 100.0, 5e-6)
    nbytes = 10e9
    t = all_reduce_s(nbytes, n=8, link=link)
    assert t == pytest.approx(2 * 7 / 8 * nbytes / 100e9, rel=0.01)
    assert all_gather_s(nbytes, n=8, link=link) == pytest.approx(t / 2, rel=0.01)
    assert all_reduce_s(nbytes, n=1, link=link) == 0


def test_a_gradient_all_reduce_across_nodes_runs_at_the_network():
    ddp = ["model=1b", "parallel=ddp", "cluster.num_workers=2", "train.global_batch_size=2", "train.micro_batch_size=1"]
    _, one_node, _ = times(ddp, ClusterSpec.of_nodes(["2xH100"]))
    _, two_nodes, _ = times(ddp, ClusterSpec.of_nodes(["1xH100", "1xH100"], network_gb_s=25))
    assert two_nodes[0].comm_overlap_ideal_s == pytest.approx(one_node[0].comm_overlap_ideal_s * 450 / 25, rel=0.01)


# --- layouts ----------------------------------------------------------------------------------
def test_fsdp_moves_more_bytes_than_ddp_and_hides_them_behind_compute():
    ddp = times(BIG + ["parallel=ddp", "cluster.num_workers=8", "precision=bf16"], ClusterSpec.of_nodes(["8xH100"]))
    fsdp = times(BIG + ["parallel=fsdp", "cluster.num_workers=8", "precision=bf16"], ClusterSpec.of_nodes(["8xH100"]))
    assert fsdp[1][0].comm_overlap_ideal_s > ddp[1][0].comm_overlap_ideal_s
    assert fsdp[2][0].comm_s < fsdp[1][0].comm_overlap_ideal_s  # most of it overlapped


def test_zero1_pays_an_unhidden_parameter_broadcast():
    base = BIG + ["cluster.num_workers=8", "precision=bf16"]
    ddp = times(base + ["parallel=ddp"], ClusterSpec.of_nodes(["8xH100"]))[1][0]
    zero1 = times(base + ["parallel=zero1"], ClusterSpec.of_nodes(["8xH100"]))[1][0]
    assert ddp.comm_fixed_ideal_s == 0 < zero1.comm_fixed_ideal_s


def test_tensor_parallel_communicates_every_block_and_splits_the_compute():
    base = ["model=1b", "cluster.num_workers=2", "train.global_batch_size=8", "train.micro_batch_size=4"]
    ddp = times(base + ["parallel=ddp", "parallel.dp=0"], ClusterSpec.of_nodes(["2xH100"]))[1][0]
    tp = times(base + ["parallel=tp"], ClusterSpec.of_nodes(["2xH100"]))[1][0]
    assert tp.comm_fixed_ideal_s > 0 == ddp.comm_fixed_ideal_s
    # half of each matmul over the whole batch: the compute of half the batch on one replica
    assert tp.compute_ideal_s == pytest.approx(ddp.compute_ideal_s, rel=0.01)


def test_pipeline_bubble_is_the_schedules():
    run = ["model=small", "parallel=pp", "cluster.num_workers=2", "train.global_batch_size=16",
           "train.micro_batch_size=2"]
    _, terms, rt = times(run, ClusterSpec.of_nodes(["2xH100"]))
    f = bubble_fraction(pp=2, n_microbatches=4)
    busy = rt[0].step_s - rt[0].bubble_s - rt[0].wait_s
    # the optimizer step (its update, the step's fixed overhead) runs once, after the flush
    piped = busy - Calibration().gpu_step_overhead_s - terms[0].memory_s
    assert terms[0].bubble_fraction == f and rt[0].bubble_s == pytest.approx(piped * f / (1 - f))


def test_activation_checkpointing_costs_recompute():
    base = BIG + ["parallel=fsdp", "cluster.num_workers=8", "precision=bf16"]
    none = times(base, ClusterSpec.of_nodes(["8xH100"]))[1][0].compute_ideal_s
    block = times(base + ["parallel.activation_checkpoint=block"], ClusterSpec.of_nodes(["8xH100"]))[1][0]
    assert 1.2 < block.compute_ideal_s / none < 4 / 3 + 1e-9  # blocks recomputed, the head not


def test_fp8_runs_its_linears_at_the_fp8_peak_on_hopper_and_emulated_on_cpu():
    base = BIG + ["parallel=fsdp", "cluster.num_workers=8"]
    bf16 = step(base + ["precision=bf16"], ClusterSpec.of_nodes(["8xH100"]))
    fp8 = step(base + ["precision=fp8_tensorwise"], ClusterSpec.of_nodes(["8xH100"]))
    assert fp8 < bf16
    cpu = ["model=1b", "cluster.num_workers=2", "train.micro_batch_size=1"]  # small's linears stay hp
    cpu_terms = times(cpu + ["precision=fp8_tensorwise"], ClusterSpec.cpu(ranks=2))[1][0]
    assert cpu_terms.fp8_ideal_s == 0 < cpu_terms.emulated_ideal_s


def test_a_slower_gpu_makes_the_step_and_the_weighted_split_recovers_it():
    base = ["model=1b", "parallel=ddp", "cluster.num_workers=2", "precision=bf16", "train.global_batch_size=32",
            "train.micro_batch_size=4"]
    mixed = ClusterSpec.of_nodes(["1xH100", "1xA100"])
    layout, _, equal = times(base, mixed)
    assert equal[0].wait_s > 0 and equal[1].wait_s == 0  # the H100 waits for the A100
    weighted_layout, _, weighted = times(base + ["parallel.dp_balance=weighted"], mixed)
    assert weighted_layout.shares[0][0] > weighted_layout.shares[1][0]  # more sequences to the H100
    assert max(t.step_s for t in weighted) < max(t.step_s for t in equal)


def test_a_weighted_splits_faster_gpu_holds_its_larger_micro_batches():
    """dp_balance=weighted cuts every rank's share into the same number of micro-batches: the
    H100's are larger, and so are its activations and logits (the state is the same)."""
    from trainlab.estimate.trial_estimate import estimate_trial

    base = ["model=1b", "parallel=ddp", "cluster.num_workers=2", "precision=bf16", "train.global_batch_size=32",
            "train.micro_batch_size=4"]
    mixed = ClusterSpec.of_nodes(["1xH100", "1xA100"])
    equal_run, weighted_run = compose_run_config(base), compose_run_config(base + ["parallel.dp_balance=weighted"])
    equal = estimate_trial(equal_run, mixed, trial_layout=plan_layout(equal_run))
    weighted = estimate_trial(weighted_run, mixed, trial_layout=plan_layout(weighted_run))
    h100, a100 = (r.memory for r in weighted.ranks)
    assert h100.state == a100.state == equal.ranks[0].memory.state
    assert h100.activations > equal.ranks[0].memory.activations > a100.activations
    assert h100.buffers > a100.buffers


def test_too_few_devices_are_refused_naming_the_workers():
    with pytest.raises(ValueError, match="cluster.num_workers=8"):
        times(BIG + ["parallel=fsdp", "cluster.num_workers=8"], ClusterSpec.of_nodes(["4xH100"]))


def test_llama3_8b_preset_is_the_published_shape():
    run = compose_run_config(["model=llama3_8b"])
    assert count_params(model_shape(run).args) == 8_030_261_248  # Llama-3-8B (Meta's model card: 8.03B)


# --- calibration file -------------------------------------------------------------------------
def test_calibration_round_trips_and_names_its_file(tmp_path):
    path = tmp_path / "cal.json"
    Calibration(gpu_efficiency=0.61, observations=3).save(path)
    cal = load_calibration(path)
    assert cal.gpu_efficiency == 0.61 and cal.source == str(path)
    assert load_calibration("") == Calibration()


@pytest.mark.parametrize("content,says", [("{", "not a calibration JSON"),
                                          (json.dumps({"gpu_eficiency": 0.5}), "unknown keys"),
                                          (json.dumps({"gpu_efficiency": -1}), "gpu_efficiency=-1")])
def test_a_bad_calibration_file_is_refused_naming_the_field(tmp_path, content, says):
    path = tmp_path / "cal.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"cluster.calibration=.*{says}"):
        load_calibration(path)
    with pytest.raises(ValueError, match="does not exist"):
        load_calibration(tmp_path / "missing.json")


# --- fit --------------------------------------------------------------------------------------
CPU_TRIALS = [["model=tiny", "parallel=ddp", "cluster.num_workers=2"],
              ["model=small", "parallel=ddp", "cluster.num_workers=2"],
              ["model=small", "parallel=fsdp", "cluster.num_workers=2", "train.micro_batch_size=4"],
              ["model=small", "parallel=zero1", "cluster.num_workers=2", "train.global_batch_size=32"],
              ["model=small", "parallel=pp", "cluster.num_workers=2", "train.micro_batch_size=2"],
              ["model=tiny", "parallel=tp", "cluster.num_workers=2", "precision=fp16"],
              ["model=small", "parallel=ddp", "cluster.num_workers=2", "precision=bf16", "train.seq_len=256"]]


def test_fit_recovers_the_coefficients_that_made_the_observations():
    from trainlab.estimate.calibration import Observation
    from trainlab.estimate.least_squares import fit

    truth = Calibration(cpu_efficiency=0.2, cpu_layer_overhead_s=0.004, cpu_step_overhead_s=0.03,
                        cpu_comm_efficiency=0.3, cpu_emulation_cost=2.0)
    observations = []
    for overrides in CPU_TRIALS:
        run, cluster = compose_run_config(overrides), ClusterSpec.cpu(ranks=2)
        measured = max(t.step_s for t in rank_times(step_terms(run, layout=Layout.of(run, cluster, plan_layout(run))),
                                                     calibration=truth))
        observations.append(Observation(run=run, trial_layout=plan_layout(run), cluster=cluster, step_time_s=measured))
    cal = fit(observations)
    assert cal.observations == len(CPU_TRIALS) and cal.source == "fit"
    assert cal.step_error_before > 0.3 and cal.step_error_after < 0.05
    assert cal.cpu_efficiency == pytest.approx(truth.cpu_efficiency, rel=0.15)
    assert cal.gpu_efficiency == Calibration().gpu_efficiency  # no GPU observation moves the GPU's


def test_fit_needs_observations():
    from trainlab.estimate.least_squares import fit

    with pytest.raises(ValueError, match="no observations"):
        fit([])


def test_more_cpu_ranks_than_cores_share_them(monkeypatch):
    """4 ranks on a 2-core host compute at half a core each: twice the compute and overheads of
    the same per-rank work on 2 ranks with a core each (an integer floor of 1 core hid this)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})
    cal = Calibration()

    def step(world: int) -> tuple[float, float]:
        run = compose_run_config(["model=tiny", "parallel=ddp", f"cluster.num_workers={world}",
                                  f"train.global_batch_size={4 * world}", "train.micro_batch_size=4"])
        layout = Layout.of(run, ClusterSpec.cpu(ranks=world), plan_layout(run))
        t = rank_times(step_terms(run, layout=layout), calibration=cal)[0]
        return layout.threads[0], t.compute_s + t.overhead_s

    (share2, busy2), (share4, busy4) = step(2), step(4)
    assert (share2, share4) == (1.0, 0.5)
    assert busy4 == pytest.approx(2 * busy2, rel=0.15)  # the optimizer's memory-bound update is not scaled


def test_fsdp_gathers_in_the_dtype_the_spec_gives_parallelize():
    """fp16 emulated on CPU gathers fp32 parameters (PrecisionSpec.fsdp_param_dtype), as the
    engine does, not the fp16 a copy of the spec's rule took: the same bytes as fp32 there."""
    base = ["model=small", "parallel=fsdp", "cluster.num_workers=2"]
    cpu = ClusterSpec.cpu(ranks=2)
    fp16, fp32, bf16 = (times(base + [f"precision={p}"], cpu)[1][0].comm_overlap_ideal_s
                        for p in ("fp16", "fp32", "bf16"))
    assert fp16 == pytest.approx(fp32)
    assert bf16 < fp32  # bf16 autocast gathers bf16 parameters
