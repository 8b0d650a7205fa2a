"""The step-time terms besides FLOPs and bytes: collective calls, DTensor redistributes, FSDP2
units, bf16's own efficiency, fp16's own emulation cost, ranks that share cores, the bubble."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainlab.config.convert import compose_run_config
from trainlab.estimate.calibration import Calibration, Observation
from trainlab.estimate.calls import tensors_of
from trainlab.estimate.least_squares import fit
from trainlab.estimate.rank_layout import Layout
from trainlab.estimate.shape import model_shape
from trainlab.estimate.timing import rank_times, step_terms
from trainlab.models.transformer import Transformer
from trainlab.plan.derive_layout import plan_layout
from trainlab.vocab.nodes import ClusterSpec

CPU2 = ["cluster.num_workers=2"]


def terms_of(overrides: list[str], cluster: ClusterSpec | None = None):
    run = compose_run_config(overrides)
    return step_terms(run, layout=Layout.of(run, cluster or ClusterSpec.cpu(ranks=run.cluster.num_workers), plan_layout(run)))


def step(overrides: list[str], cal: Calibration | None = None, cluster: ClusterSpec | None = None) -> float:
    return max(t.step_s for t in rank_times(terms_of(overrides, cluster), calibration=cal or Calibration()))


@pytest.fixture
def two_cores(monkeypatch):
    """This host as a 2-core machine, whatever it really has (4 ranks: half a core each)."""
    monkeypatch.setattr("os.sched_getaffinity", lambda _pid: {0, 1})


# --- counting calls -----------------------------------------------------------------------------
def test_zero1_broadcasts_every_parameter_tensor_of_the_real_model():
    run = compose_run_config(["model=small", "parallel=zero1", *CPU2])
    with torch.device("meta"):
        tensors = len(list(Transformer(model_shape(run).args).parameters()))
    shape = model_shape(run)
    assert tensors_of(list(range(shape.n_layers)), n_layers=shape.n_layers) == tensors
    ddp, zero1 = terms_of(["model=small", "parallel=ddp", *CPU2])[0], terms_of(["model=small", "parallel=zero1", *CPU2])[0]
    assert zero1.calls - ddp.calls == tensors


def test_ddp_makes_one_call_per_gradient_bucket():
    big, small = (terms_of(["model=small", "parallel=ddp", *CPU2, f"parallel.bucket_cap_mb={mb}"])[0].calls
                  for mb in (25, 1))
    assert small > big + 5  # 13 MB of small's gradients: 2 buckets of 25 MB's, 13 of 1 MB's


def test_fsdp_gathers_every_block_forward_and_again_backward_per_micro_batch():
    one, two = (terms_of(["model=small", "parallel=fsdp", *CPU2, f"train.micro_batch_size={m}"])[0]
                for m in (8, 4))
    blocks = model_shape(compose_run_config(["model=small"])).n_layers
    assert two.calls - one.calls == 2 * blocks  # blocks + root forward, blocks - 1 re-gathered backward
    zero2 = terms_of(["model=small", "parallel=zero2", *CPU2])[0]
    assert zero2.calls == one.calls - (blocks - 1)  # zero2 keeps its blocks gathered for backward


def test_sequence_parallel_trades_each_tp_all_reduce_for_more_calls():
    tp = terms_of(["model=tiny", "parallel=tp", *CPU2])[0]
    sp = terms_of(["model=tiny", "parallel=tp", "parallel.sequence_parallel=true", *CPU2])[0]
    assert sp.calls > 2 * tp.calls - 10 and sp.redistributes > 2 * tp.redistributes - 10 > 0
    assert terms_of(["model=tiny", "parallel=ddp", *CPU2])[0].redistributes == 0


def test_a_pipeline_stage_sends_and_receives_per_micro_batch():
    four, eight = (terms_of(["model=small", "parallel=pp", *CPU2, f"parallel.pp_microbatches={m}",
                             "train.micro_batch_size=2"])[0].calls for m in (4, 8))
    assert eight - four == 2 * 4  # stage 0: an activation sent and a gradient received per micro-batch


# --- what calls cost ----------------------------------------------------------------------------
def test_each_collective_call_costs_call_s_besides_its_bytes():
    run = ["model=tiny", "parallel=tp", *CPU2]
    t = terms_of(run)[0]
    base, more = Calibration(), Calibration(cpu_call_s=Calibration().cpu_call_s + 0.001)
    assert step(run, more) - step(run, base) == pytest.approx(t.calls * 0.001, rel=1e-6)


def test_tensor_parallel_pays_a_dtensor_redistribute_per_collective():
    run = ["model=tiny", "parallel=tp", *CPU2]
    t = terms_of(run)[0]
    more = Calibration(cpu_redistribute_s=Calibration().cpu_redistribute_s + 0.001)
    assert step(run, more) - step(run) == pytest.approx(t.redistributes * 0.001, rel=1e-6)
    # the same bytes (sequence parallel's pairs move the all-reduce's volume), more redistributes
    assert step(run + ["parallel.sequence_parallel=true"]) > 1.3 * step(run)


def test_fsdp_units_pay_their_hooks_and_copies_per_gather():
    run = ["model=tiny", "parallel=fsdp", *CPU2]
    t = terms_of(run)[0]
    assert t.unit_gathers > 0 == terms_of(["model=tiny", "parallel=ddp", *CPU2])[0].unit_gathers
    more = Calibration(cpu_unit_overhead_s=Calibration().cpu_unit_overhead_s + 0.001)
    assert step(run, more) - step(run) == pytest.approx(t.unit_gathers * 0.001, rel=1e-6)


def test_nccl_calls_cost_tens_of_microseconds():
    t = terms_of(["model=1b", "parallel=tp", "cluster.num_workers=2", "train.micro_batch_size=4",
                  "train.global_batch_size=8"], ClusterSpec.of_nodes(["2xH100"]))[0]
    cal = Calibration()
    per_call = (t.calls * cal.gpu_call_s + t.latency_s) / t.calls
    assert 12e-6 < per_call <= 30e-6  # the link's latency (5 us a hop) and NCCL's call (10 us)


# --- precision ------------------------------------------------------------------------------------
def test_bf16_matmuls_on_cpu_run_at_their_own_efficiency_and_emulated_fp16_at_fp32s():
    bf16, fp16 = ["model=tiny", "parallel=ddp", *CPU2, "precision=bf16"], ["model=tiny", "parallel=ddp", *CPU2,
                                                                           "precision=fp16"]
    half = Calibration(cpu_half_efficiency=Calibration().cpu_half_efficiency / 2)
    full = Calibration(cpu_efficiency=Calibration().cpu_efficiency / 2)
    compute = terms_of(bf16)[0].compute_ideal_s / Calibration().cpu_half_efficiency
    assert step(bf16, half) - step(bf16) == pytest.approx(compute, rel=1e-6)
    assert step(bf16, full) == step(bf16)
    assert step(fp16, half) == step(fp16) < step(fp16, full)  # its matmuls run in fp32 (precision.emulate)


def test_fp16_emulation_costs_apart_from_fp8s():
    fp16 = ["model=tiny", "parallel=ddp", *CPU2, "precision=fp16"]
    fp8 = ["model=tiny", "parallel=ddp", *CPU2, "precision=emulated"]
    fp8_cost = Calibration(cpu_emulation_cost=Calibration().cpu_emulation_cost * 2)
    fp16_cost = Calibration(cpu_fp16_emulation_cost=Calibration().cpu_fp16_emulation_cost * 2)
    assert step(fp16, fp8_cost) == step(fp16) < step(fp16, fp16_cost)
    assert step(fp8, fp16_cost) == step(fp8) < step(fp8, fp8_cost)


# --- ranks that share cores, and the bubble ---------------------------------------------------------
def test_ranks_that_outnumber_the_cores_wait_for_descheduled_peers(two_cores):
    four = ["model=small", "parallel=ddp", "cluster.num_workers=4", "train.micro_batch_size=4"]
    more = Calibration(cpu_contended_comm_cost=Calibration().cpu_contended_comm_cost * 2)
    t = terms_of(four)[0]
    assert t.core_share == 0.5 and t.comm_contended_ideal_s > 0
    assert step(four, more) - step(four) == pytest.approx(t.comm_contended_ideal_s * Calibration()
                                                          .cpu_contended_comm_cost, rel=1e-6)
    two = ["model=small", "parallel=ddp", *CPU2]
    assert step(two, more) == step(two)  # a core each: nobody is descheduled


def test_a_ring_of_four_waits_on_more_peers_than_pairs_do(two_cores):
    base = ["model=small", "cluster.num_workers=4", "train.micro_batch_size=4"]
    ring, pairs = terms_of(base + ["parallel=fsdp"])[0], terms_of(base + ["parallel=hsdp"])[0]

    def per_byte(t) -> float:
        return t.comm_contended_ideal_s / (t.comm_fixed_ideal_s + t.comm_overlap_ideal_s)

    assert per_byte(ring) == pytest.approx(3, rel=0.01) and per_byte(pairs) == pytest.approx(1, rel=0.01)


def test_pipeline_replicas_all_reduce_after_the_flush_while_nothing_computes(two_cores):
    t = terms_of(["model=small", "parallel=dp_pp", "cluster.num_workers=4", "train.micro_batch_size=4"])[0]
    assert t.comm_overlap_ideal_s == 0 < t.comm_fixed_ideal_s
    assert t.comm_contended_ideal_s < t.comm_fixed_ideal_s  # only the stages' p2p contends


def test_a_bubble_on_shared_cores_is_filled_by_the_other_ranks(two_cores):
    shared = rank_times(terms_of(["model=small", "parallel=dp_pp", "cluster.num_workers=4",
                                  "train.micro_batch_size=4"]), calibration=Calibration())
    own = rank_times(terms_of(["model=small", "parallel=pp", *CPU2]), calibration=Calibration())
    assert own[0].bubble_s > 0 and shared[0].bubble_s == 0


def test_the_optimizer_step_waits_out_no_bubble():
    run = ["model=small", "parallel=pp", *CPU2]
    more = Calibration(cpu_step_overhead_s=Calibration().cpu_step_overhead_s + 0.01)
    assert step(run, more) - step(run) == pytest.approx(0.01, rel=1e-6)


# --- fit ---------------------------------------------------------------------------------------------
FIT_TRIALS = [["model=tiny", "parallel=ddp", *CPU2], ["model=small", "parallel=ddp", *CPU2],
              ["model=tiny", "parallel=fsdp", *CPU2], ["model=small", "parallel=fsdp", *CPU2],
              ["model=tiny", "parallel=tp", *CPU2], ["model=small", "parallel=tp", "parallel.sequence_parallel=true",
                                                     *CPU2],
              ["model=small", "parallel=zero1", *CPU2], ["model=small", "parallel=pp", *CPU2],
              ["model=tiny", "parallel=ddp", *CPU2, "precision=bf16"],
              ["model=small", "parallel=ddp", *CPU2, "precision=bf16"],
              ["model=tiny", "parallel=ddp", *CPU2, "precision=fp16"],
              ["model=small", "parallel=ddp", *CPU2, "precision=fp16"],
              ["model=small", "parallel=ddp", *CPU2, "precision=emulated"],
              ["model=small", "parallel=ddp", "cluster.num_workers=4", "train.micro_batch_size=4"],
              ["model=small", "parallel=fsdp", "cluster.num_workers=4", "train.micro_batch_size=4"],
              ["model=small", "parallel=dp_pp", "cluster.num_workers=4", "train.micro_batch_size=4"]]


def test_fit_recovers_the_call_redistribute_unit_contention_and_bf16_coefficients(two_cores):
    truth = dataclasses.replace(Calibration(), cpu_redistribute_s=0.004, cpu_unit_overhead_s=0.001,
                                cpu_half_efficiency=0.2, cpu_contended_comm_cost=20.0,
                                cpu_fp16_emulation_cost=0.5)
    observations = []
    for overrides in FIT_TRIALS:
        run = compose_run_config(overrides)
        cluster = ClusterSpec.cpu(ranks=run.cluster.num_workers)
        measured = max(t.step_s for t in rank_times(step_terms(run, layout=Layout.of(run, cluster, plan_layout(run))),
                                                     calibration=truth))
        observations.append(Observation(run=run, trial_layout=plan_layout(run), cluster=cluster, step_time_s=measured))
    cal = fit(observations)
    assert cal.step_error_after < 0.03 < cal.step_error_before
    for name in ("cpu_redistribute_s", "cpu_unit_overhead_s", "cpu_half_efficiency", "cpu_contended_comm_cost",
                 "cpu_fp16_emulation_cost"):
        assert getattr(cal, name) == pytest.approx(getattr(truth, name), rel=0.2), name
