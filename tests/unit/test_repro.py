"""Reproducibility without processes: the canonical parameter checksum, the loss-curve checksum,
compare's grouping of runs that should match (records built here), and the config rules."""

from __future__ import annotations

import hashlib
import struct

import pytest
import torch
from torch import nn

from trainlab import names
from trainlab.compare import summarize, tables
from trainlab.compare.records import Trial
from trainlab.compare.repro import math_key, reproducibility, same_math
from trainlab.config import compose_run_config, ignored_options
from trainlab.models import build_model
from trainlab.parallel.pp import split_stages
from trainlab.plan.derive_layout import plan_layout, unordered_reductions
from trainlab.telemetry.checksum import (
    canonical_name,
    combine,
    loss_curve_sha256,
    param_digests,
    params_checksum,
)


@pytest.fixture(scope="module")
def model() -> nn.Module:
    torch.manual_seed(0)
    return build_model(compose_run_config(["model=tiny", "model.n_layers=4"]).model, vocab_size=64)


# -- checksums ---------------------------------------------------------------------------------
def test_wrapper_segments_are_dropped_from_names():
    assert canonical_name("module._orig_mod.layers.0._checkpoint_wrapped_module.attention.wq.weight") \
        == "layers.0.attention.wq.weight"
    assert canonical_name("norm.weight") == "norm.weight"


def test_checksum_is_the_same_through_wrappers_and_pipeline_stages(model):
    whole = params_checksum([model])

    class Wrapper(nn.Module):  # DDP and torch.compile hold the model under these attributes
        def __init__(self, inner):
            super().__init__()
            self.module = nn.Module()
            self.module._orig_mod = inner

    assert params_checksum([Wrapper(model)]) == whole
    # two pipeline ranks' stages (pruned copies keeping the model's names), merged by name
    pieces = {}
    for rank in range(2):
        pieces |= param_digests(split_stages(model, pp_rank=rank, pp_size=2))
    assert combine(pieces) == whole
    assert whole.num_tensors == len(list(model.parameters()))
    expected_norm = torch.sqrt(sum(p.double().square().sum() for p in model.parameters())).item()
    assert whole.norm == pytest.approx(expected_norm, rel=1e-12)


def test_checksum_changes_with_one_bit_of_one_parameter(model):
    before = params_checksum([model])
    w = model.norm.weight
    with torch.no_grad():
        old = w[0].clone()
        w[0] = torch.nextafter(old, torch.tensor(float("inf")))
    try:
        after = params_checksum([model])
    finally:
        with torch.no_grad():
            w[0] = old
    assert after.sha256 != before.sha256
    assert params_checksum([model]) == before


def test_loss_curve_checksum_is_over_exact_float64_bytes():
    losses = [4.5, 4.25, 3.9999999999999996]
    assert loss_curve_sha256(losses) == hashlib.sha256(struct.pack("<3d", *losses)).hexdigest()
    assert loss_curve_sha256(losses) != loss_curve_sha256([4.5, 4.25, 4.0])  # one ulp apart


# -- compare: groups of runs that should match -------------------------------------------------
BASE = {"seed": "0", "model.name": "tiny", "precision.name": "fp32", "parallel.comm_dtype": "fp32",
        "parallel.name": "ddp", "cluster.num_workers": "1", "train.deterministic": "False",
        "tracking.experiment": "x"}


def _trial(run_id: str, losses: list[float], *, params=None, val=3.0, norm=10.0,
           params_sha="p", status=names.STATUS_FINISHED) -> Trial:
    return Trial(run_id=run_id, label=run_id, status=status, seed="0", params={**BASE, **(params or {})},
                 params_sha=params_sha, loss_curve_sha=loss_curve_sha256(losses),
                 metrics={names.LOSS: tuple(enumerate(losses, 1)), names.VAL_LOSS: ((len(losses), val),),
                          names.PARAM_NORM: ((len(losses), norm),)})


def test_layout_and_device_set_keys_do_not_change_the_math_but_precision_and_comm_do():
    for key in ("cluster.num_workers", "cluster.device", "parallel.name", "parallel.tp", "parallel.dp",
                "train.deterministic", "tracking.uri", "output_dir"):
        assert same_math(key), key
    for key in ("seed", "precision.name", "parallel.comm_dtype", "parallel.powersgd_rank",
                "train.micro_batch_size", "train.max_steps", "optim.lr", "model.dim", "data.seed"):
        assert not same_math(key), key
    a = _trial("a", [1.0])
    assert math_key(a) == math_key(_trial("b", [1.0], params={"cluster.num_workers": "2", "parallel.name": "fsdp"}))
    assert math_key(a) != math_key(_trial("c", [1.0], params={"parallel.comm_dtype": "bf16"}))


def test_reproducibility_reports_identity_and_the_spread_of_differing_runs():
    ref = [4.0, 3.5, 3.0, 2.75]
    other = [4.0, 3.5 + 2e-6, 3.0 - 5e-6, 2.75 + 1e-6]
    trials = [
        _trial("one", ref, norm=10.0),
        _trial("two", other, params={"cluster.num_workers": "2"}, val=3.0 + 4e-6, norm=10.001,
               params_sha="q"),
        _trial("same", ref, params={"train.deterministic": "True"}, norm=10.0),
        _trial("seed1", ref, params={"seed": "1"}),  # other math: alone, no group
        _trial("failed", ref, params={"cluster.num_workers": "4"}, status=names.STATUS_FAILED),
    ]
    (g,) = reproducibility(trials)
    assert [r.split()[0] for r in g.runs] == ["one", "two", "same"]
    assert g.differs_in == ("cluster.num_workers", "train.deterministic")
    assert not g.loss_curves_identical and not g.params_identical
    assert g.max_abs_dloss == pytest.approx(5e-6, rel=1e-6) and g.dloss_step == 3
    assert g.max_rel_dloss == pytest.approx(5e-6 / ((3.0 + 3.0 + 3.0 - 5e-6) / 3), rel=1e-6)
    assert g.d_val_loss == pytest.approx(4e-6, rel=1e-6)
    assert g.rel_d_param_norm == pytest.approx(0.001 / 10.001)

    (same,) = reproducibility([trials[0], trials[2]])
    assert same.loss_curves_identical and same.params_identical
    assert same.max_abs_dloss == 0.0 and same.dloss_step is None


def test_compare_prints_the_section_only_when_some_runs_should_match():
    pair = [_trial("one", [4.0, 3.0]), _trial("two", [4.0, 3.1], params={"cluster.num_workers": "2"})]
    with_group = summarize(pair)
    md = tables.markdown_document(with_group, title="t", context=[])
    assert "## Reproducibility" in md and "0.1" in md and "differ" in md
    assert any("reproducibility" in (t.title or "") for t in tables.rich_tables(with_group, title="t"))
    alone = summarize([pair[0], _trial("seed1", [4.0, 3.0], params={"seed": "1"})])
    assert alone.repro == ()
    assert "Reproducibility" not in tables.markdown_document(alone, title="t", context=[])
    assert len(tables.rich_tables(alone, title="t")) == 2


# -- config ----------------------------------------------------------------------------------
def test_deterministic_mode_is_refused_with_powersgd_and_names_what_it_leaves_unordered():
    with pytest.raises(ValueError, match=r"train.deterministic=true with parallel.powersgd_rank=2.*"
                                         r"set parallel.powersgd_rank=0"):
        plan_layout(compose_run_config(["train.deterministic=true", "parallel.powersgd_rank=2"]))
    fsdp = compose_run_config(["train.deterministic=true", "parallel=fsdp"])
    notes = ignored_options(fsdp) + unordered_reductions(fsdp)  # what preflight warns about
    assert any("parallel.data_parallel=fsdp" in n and "DDP gradients only" in n for n in notes)
    ddp = compose_run_config(["train.deterministic=true", "parallel=ddp"])
    assert not ignored_options(ddp) + unordered_reductions(ddp)
