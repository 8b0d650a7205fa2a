"""Layouts that cannot work are refused before launch, naming the fields and the fix."""

from __future__ import annotations

import pytest

from trainlab.config import compose_run_config
from trainlab.config.validate import check_run
from trainlab.launch.preflight import check_layout
from trainlab.plan.derive_layout import plan_layout, pp_microbatches


def _refusal(overrides: list[str]) -> str:
    with pytest.raises(ValueError) as info:
        run = compose_run_config(["model=tiny", "cluster.device=cpu", *overrides])
        check_run(run)
        plan_layout(run)
        check_layout(run)
    return str(info.value)


@pytest.mark.parametrize(("overrides", "fields"), [
    (["parallel=pp", "model.n_layers=3"], ["model.n_layers=3", "parallel.pp=2"]),
    (["parallel=pp", "precision=fp16"], ["precision=fp16", "parallel.pp=2"]),
    (["parallel=pp", "parallel.pp_microbatches=1"], ["parallel.pp_microbatches", "gpipe"]),
    (["parallel=pp", "parallel.data_parallel=fsdp"], ["parallel.data_parallel=fsdp"]),
    (["parallel=pp", "model.n_layers=4", "parallel.pp_schedule=interleaved_1f1b", "parallel.pp_virtual_stages=2",
      "parallel.pp_microbatches=5", "train.global_batch_size=10", "train.micro_batch_size=1",
      "train.eval_batches=10"], ["interleaved_1f1b", "parallel.pp_microbatches=5"]),
    (["parallel=hsdp", "cluster.num_workers=3", "train.global_batch_size=24"],
     ["parallel.dp=3", "parallel.dp_replicate=2"]),
    (["parallel=tp", "model.n_heads=8", "model.n_kv_heads=1"], ["model.n_kv_heads=1", "parallel.tp=2"]),
    (["parallel=tp", "precision=fp8_tensorwise"], ["precision=fp8_tensorwise", "parallel.tp=2"]),
    (["parallel=tp", "parallel.pp=2", "cluster.num_workers=4"], ["parallel.tp=2", "parallel.pp=2"]),
    (["parallel=ddp", "parallel.sequence_parallel=true"], ["parallel.sequence_parallel"]),
    (["parallel=ddp", "parallel.dp_replicate=2"], ["parallel.dp_replicate=2"]),
    (["parallel=fsdp", "train.compile=true"], ["train.compile_unit=model", "parallel.data_parallel=fsdp",
                                               "train.compile_unit=block"]),
    (["parallel=pp", "train.compile=true"], ["train.compile_unit=model", "parallel.pp=2"]),
    (["train.compile_unit=graph"], ["train.compile_unit='graph'", "model, block"]),
    # gradient communication that only DDP's hooks can do, in layouts that reduce without DDP
    (["parallel=dp_tp", "cluster.num_workers=4", "parallel.powersgd_rank=2"],
     ["parallel.powersgd_rank=2", "parallel.tp=2", "parallel.powersgd_rank=0"]),
    (["parallel=dp_tp", "cluster.num_workers=4", "precision=emulated", "precision.formats.comm_grads=e4m3"],
     ["precision.formats.comm_grads='e4m3'", "parallel.tp=2", "precision.formats.comm_grads=''"]),
    (["parallel=fsdp", "precision=emulated", "precision.formats.comm_grads=e4m3"],
     ["precision.formats.comm_grads='e4m3'", "parallel.data_parallel=fsdp"]),
    (["parallel=dp_pp", "model.n_layers=4", "cluster.num_workers=4", "train.micro_batch_size=2",
      "parallel.powersgd_rank=1"], ["parallel.powersgd_rank=1", "parallel.pp=2"]),
    (["parallel=dp_pp", "model.n_layers=4", "cluster.num_workers=4", "train.micro_batch_size=2",
      "parallel.comm_dtype=fp16"], ["parallel.comm_dtype=fp16", "parallel.pp=2", "parallel.comm_dtype=fp32"]),
])
def test_impossible_layouts_are_refused_with_the_fields(overrides, fields):
    msg = _refusal(overrides)
    for field in fields:
        assert field in msg, msg


def test_pipeline_microbatches_default_to_the_accumulation_count():
    run = compose_run_config(["model=tiny", "model.n_layers=4", "parallel=dp_pp", "cluster.num_workers=4",
                              "parallel.pp_microbatches=0", "train.global_batch_size=16",
                              "train.micro_batch_size=2"])
    assert pp_microbatches(run) == 4  # 16 sequences / dp 2 / micro-batch 2


@pytest.mark.parametrize("overrides", [
    ["parallel=dp_tp", "cluster.num_workers=4", "parallel.comm_dtype=fp16"],  # replicate reduces in fp16
    ["parallel=ddp", "parallel.powersgd_rank=2"],  # DDP: its hooks apply
    ["parallel=zero1", "precision=emulated", "precision.formats.comm_grads=e4m3"],
    ["parallel=tp", "parallel.powersgd_rank=2"],  # one data-parallel replica: nothing is sent
])
def test_data_parallel_communication_the_layout_can_send_passes(overrides):
    run = compose_run_config(["model=tiny", "cluster.device=cpu", "train.global_batch_size=32", *overrides])
    check_run(run)
    plan_layout(run)
    check_layout(run)


@pytest.mark.parametrize("layout", ["ddp", "zero1", "zero2", "fsdp", "tp", "pp", "dp_tp"])
def test_layouts_that_fit_two_workers_pass(layout):
    run = compose_run_config(["model=tiny", "model.n_layers=4", f"parallel={layout}", "cluster.device=cpu"])
    check_run(run)
    plan_layout(run)
    check_layout(run)
