"""FP8 modes as a user meets them: precision.keep_hp decides which layers really convert (by
module type, not by what the plan claims), a typo is refused, every fp8 mode trains the tiny
model through the real Trainer (fp8_rowwise_gw_hp under bf16 autocast included, which plain
torchao cannot do), emulation on request, the capability table, MFU names and run tags."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.schema import PrecisionConfig
from trainlab.engine.run import _layer_tags, build_trainer
from trainlab.launch.preflight import check_device, check_module_names
from trainlab.models import build_model
from trainlab.plan.trial_plan import Where, plan_trial
from trainlab.precision import capability as precision_capability
from trainlab.precision.capability import (
    MIN_CUDA_CAPABILITY,
    check_precision_supported,
    cpu_rowwise_scaled_mm,
)
from trainlab.precision.fp8_delayed import DelayedScalingFp8Linear
from trainlab.precision.policy import check_keep_hp
from trainlab.precision.recipes import build_recipe
from trainlab.telemetry import Peak, Throughput, device_peak, peak_flops
from trainlab.vocab.precision import FP8_PRECISIONS, KEEP_HP_SELECTORS, PRECISIONS

pytestmark = pytest.mark.usefixtures("one_thread")

UNALIGNED_VOCAB = 260  # not a multiple of 16 (and holds the default corpus's 256 ids): the output head 64 -> 260 cannot run in FP8 on a GPU
N_BLOCKS, PER_BLOCK = 2, 7  # model=tiny: wq wk wv wo w1 w2 w3 in each of 2 blocks
N_LINEARS = N_BLOCKS * PER_BLOCK + 1  # + the output head

TINY_RUN = [
    "model=tiny", "data=markov", "train.max_steps=12", "train.global_batch_size=4",
    "train.micro_batch_size=4", "train.seq_len=32", "cluster.num_workers=1",
    "train.eval_every=0", "train.eval_batches=1", "cluster.device=cpu",
    "precision.keep_hp=[output,unaligned]",  # tiny's linears are all 'small': FP8 on every aligned one
]
EVERY_ALIGNED = ["output", "unaligned"]
TRAIN_STEPS = 15
# measured: fp32 and every fp8 mode fall from ~4.18 to ~3.89 over 15 steps (a drop of ~0.29);
# half of that is a margin no noise reaches and a broken recipe (no learning) cannot pass
MIN_LOSS_DROP = 0.15
# measured: every fp8 mode ends within 0.002 of fp32 on this run
MAX_GAP_TO_FP32 = 0.03


@pytest.fixture(scope="module")
def float8_linear():
    """torchao's module class, imported only by the tests that need it (its import is slow)."""
    from torchao.float8.float8_linear import Float8Linear

    return Float8Linear


@pytest.fixture(scope="module")
def tiny_cfg():
    return compose_run_config(["model=tiny", f"model.vocab_size={UNALIGNED_VOCAB}"]).model


def quick_build(run, dist_info, tracker=None):
    """build_trainer with a fixed CPU peak: the matmul probe (about a second per trainer with
    bf16) measures nothing these tests check; the MFU test below uses the real one."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(peak_flops, "cpu_probe_peak", lambda dtype, **_: Peak(1e11, f"probe:cpu:{dtype}"))
        return build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)


def tiny_model(cfg) -> nn.Module:
    torch.manual_seed(0)
    return build_model(cfg, vocab_size=UNALIGNED_VOCAB)


def fp8_type(precision: str, float8_linear) -> type:
    return DelayedScalingFp8Linear if precision == "fp8_delayed" else float8_linear


def linear_names(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]


ROWWISE = ("fp8_rowwise", "fp8_rowwise_gw_hp")


def skip_native_rowwise_without_cpu_kernels(precision: str, impl: str = "native") -> None:
    """torch 2.11's CPU _scaled_mm has no rowwise scales: those modes run there emulated only
    (the refusal is tested below); on CUDA and on torch 2.13's CPU they run natively."""
    if precision in ROWWISE and impl == "native" and not cpu_rowwise_scaled_mm():
        pytest.skip(f"torch {torch.__version__}: CPU _scaled_mm takes no rowwise scales")


# ---------------------------------------------------------------------------- keep_hp policy
ATTENTION = [f"layers.{b}.attention.{w}" for b in range(N_BLOCKS) for w in ("wq", "wk", "wv", "wo")]


def _in_block(block: int):
    return lambda name: name.startswith(f"layers.{block}.")


KEEP_HP_CASES = {
    # keep_hp -> (predicate for the names kept in high precision, reason recorded for the head)
    "default": (["output", "unaligned"], lambda n: n == "output", "output"),
    "first_block": (["first_block", "output"], lambda n: n == "output" or _in_block(0)(n), "output"),
    "last_block": (["last_block", "output"], lambda n: n == "output" or _in_block(1)(n), "output"),
    # no 'output' entry: the 64 -> 260 head is kept because it is unaligned
    "attention_glob": (["layers.*.attention.*", "unaligned"],
                       lambda n: n == "output" or n in ATTENTION, "unaligned"),
}


@pytest.mark.parametrize("case", sorted(KEEP_HP_CASES))
@pytest.mark.parametrize("precision", FP8_PRECISIONS)
def test_keep_hp_decides_which_modules_are_converted(precision, case, tiny_cfg, float8_linear):
    skip_native_rowwise_without_cpu_kernels(precision)
    keep_hp, kept, head_reason = KEEP_HP_CASES[case]
    model = tiny_model(tiny_cfg)
    names_before = linear_names(model)
    assert len(names_before) == N_LINEARS and model.output.out_features == UNALIGNED_VOCAB
    cfg = PrecisionConfig(name=precision, keep_hp=keep_hp, hp_dtype="fp32")
    recipe = build_recipe(cfg, device_type="cpu")
    model = recipe.prepare(model)

    lowp_type = fp8_type(precision, float8_linear)
    modules = dict(model.named_modules())
    converted = [n for n in names_before if isinstance(modules[n], lowp_type)]
    plain = [n for n in names_before if type(modules[n]) is nn.Linear]
    assert sorted(converted + plain) == sorted(names_before)  # nothing else, nothing lost
    assert plain == [n for n in names_before if kept(n)]
    assert converted == [n for n in names_before if not kept(n)]
    if case == "attention_glob":
        assert sorted(plain) == sorted([*ATTENTION, "output"])

    # what the run records agrees with the module types
    plan = recipe.plan
    assert plan.summary == f"{len(converted)}/{N_LINEARS}"
    assert plan.lowp == converted
    assert plan.hp["output"] == head_reason
    assert all(plan.hp[n] == keep_hp[0] for n in plain if n != "output")  # the entry that kept it
    assert sorted(plan.hp) == sorted(plain)
    assert [n for n, _, _ in recipe.casts] == converted
    assert all(module is modules[name] for name, module, _ in recipe.casts)

    # the prepared model still runs and predicts over the whole (unaligned) vocabulary
    out = model(torch.randint(0, UNALIGNED_VOCAB, (2, 16)))
    assert out.shape == (2, 16, UNALIGNED_VOCAB) and torch.isfinite(out).all()


# ---------------------------------------------------------------------------- typos
def test_check_keep_hp_refuses_a_glob_that_matches_nothing(tiny_cfg):
    model = tiny_model(tiny_cfg)
    with pytest.raises(ValueError) as info:
        check_keep_hp(model, ["output", "ouptut"])
    msg = str(info.value)
    assert "precision.keep_hp" in msg and "'ouptut'" in msg
    assert all(selector in msg for selector in KEEP_HP_SELECTORS)  # the fix is in the message
    # every keyword and a glob that matches pass
    check_keep_hp(model, [*KEEP_HP_SELECTORS, "layers.*.attention.*", "layers.1.feed_forward.w2"])


@pytest.mark.parametrize(("override", "field", "value"), [
    ("precision.keep_hp=[ouptut]", "precision.keep_hp", "ouptut"),
    ("debug.inject_nan=layers.9.feed_forward@3", "debug.inject_nan", "layers.9.feed_forward"),
])
def test_preflight_refuses_module_names_the_model_lacks(override, field, value):
    run = compose_run_config(TINY_RUN + [override])
    with pytest.raises(ValueError) as info:
        check_module_names(run)
    assert field in str(info.value) and value in str(info.value)


def test_preflight_accepts_module_names_the_model_has():
    check_module_names(compose_run_config(TINY_RUN + [
        "precision.keep_hp=[first_block,layers.*.attention.wo]",
        "debug.inject_nan=layers.1.feed_forward@3"]))


def test_engine_refuses_a_keep_hp_typo_without_preflight(dist_info):
    run = compose_run_config(TINY_RUN + ["precision=fp8_tensorwise", "precision.keep_hp=[ouptut]"])
    with pytest.raises(ValueError, match="ouptut"):
        quick_build(run, dist_info)


# ---------------------------------------------------------------------------- training
@pytest.fixture(scope="module")
def fp32_final_loss(dist_info):
    run = compose_run_config(TINY_RUN + ["precision=fp32", f"train.max_steps={TRAIN_STEPS}"])
    return quick_build(run, dist_info).train().final_loss


def _train(dist_info, precision: str, *extra: str):
    run = compose_run_config(TINY_RUN + [f"precision={precision}", "precision.hp_dtype=bf16",
                                         f"train.max_steps={TRAIN_STEPS}", *extra])
    tracker = RecordingTracker()
    trainer = quick_build(run, dist_info, tracker=tracker)
    return trainer, trainer.train(), tracker


# native (on CPU: real float8 casts and torch._scaled_mm) for every mode;
# emulated for one torchao recipe and the delayed one (the two code paths of emulate=True)
TRAINED = [(p, "native") for p in FP8_PRECISIONS] + [
    ("fp8_rowwise_gw_hp", "emulated"), ("fp8_delayed", "emulated")]


@pytest.mark.parametrize(("precision", "impl"), TRAINED)
def test_every_fp8_mode_trains_the_tiny_model(precision, impl, dist_info, fp32_final_loss, float8_linear):
    skip_native_rowwise_without_cpu_kernels(precision, impl)
    trainer, result, tracker = _train(dist_info, precision, f"precision.fp8_impl={impl}")

    # the model really ran FP8 linears, natively or emulated as asked
    emulated = impl == "emulated"
    assert trainer.recipe.emulated is emulated
    fp8_modules = [m for m in trainer.model.modules() if isinstance(m, fp8_type(precision, float8_linear))]
    assert len(fp8_modules) == N_BLOCKS * PER_BLOCK  # markov vocab 64: only 'output' kept
    for m in fp8_modules:
        assert (m.emulate if precision == "fp8_delayed" else m.config.emulate) is emulated

    losses = tracker.by_step(names.LOSS)
    assert result.status == names.STATUS_FINISHED and result.steps == TRAIN_STEPS
    assert sorted(losses) == list(range(1, TRAIN_STEPS + 1))
    assert all(math.isfinite(v) for v in losses.values())
    assert result.skipped_steps == 0 and result.nonfinite_steps == 0
    assert losses[TRAIN_STEPS] < losses[1] - MIN_LOSS_DROP, losses
    assert abs(result.final_loss - fp32_final_loss) < MAX_GAP_TO_FP32, (result.final_loss, fp32_final_loss)

    # numerics sampled (steps 1 and 10): a scale computed from the tensor's own amax cannot
    # overflow, so the probe must not report it (only delayed scaling can)
    overflow = {k: tracker.by_step(names.cast_max_metric(k, names.CAST_OVERFLOW))
                for k in ("input", "weight", "grad_output")}
    assert all(sorted(v) == [1, 10] for v in overflow.values()), overflow
    if precision != "fp8_delayed":
        assert all(x == 0.0 for v in overflow.values() for x in v.values()), overflow


@pytest.mark.parametrize("precision", FP8_PRECISIONS)
def test_fp8_impl_emulated_converts_to_emulating_modules(precision, tiny_cfg, float8_linear):
    for impl, emulated in [("emulated", True), ("native", False)]:
        cfg = PrecisionConfig(name=precision, fp8_impl=impl, hp_dtype="fp32", keep_hp=EVERY_ALIGNED)
        if impl == "native" and precision in ROWWISE and not cpu_rowwise_scaled_mm():
            with pytest.raises(ValueError, match="precision.fp8_impl=emulated"):  # torch 2.11's CPU
                build_recipe(cfg, device_type="cpu").prepare(tiny_model(tiny_cfg))
            continue
        recipe = build_recipe(cfg, device_type="cpu")
        model = recipe.prepare(tiny_model(tiny_cfg))
        fp8_modules = [m for m in model.modules() if isinstance(m, fp8_type(precision, float8_linear))]
        assert len(fp8_modules) == N_BLOCKS * PER_BLOCK and recipe.emulated is emulated
        assert all((m.emulate if precision == "fp8_delayed" else m.config.emulate) is emulated
                   for m in fp8_modules), impl


def test_plain_torchao_gw_hp_fails_under_bf16_autocast_where_the_recipe_trains(tiny_cfg):
    """Why fp8.convert_torchao adds its input cast: without it torchao's rowwise_with_gw_hp
    weight-gradient matmul mixes the bf16 gradient with the fp32 saved input."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    skip_native_rowwise_without_cpu_kernels("fp8_rowwise_gw_hp")

    def loss_of(model: nn.Module, autocast) -> torch.Tensor:
        tokens = torch.randint(0, UNALIGNED_VOCAB, (2, 32), generator=torch.Generator().manual_seed(0))
        with autocast:
            logits = model(tokens)
        assert logits.dtype == torch.bfloat16  # the head ran under bf16 autocast
        return F.cross_entropy(logits.float().flatten(0, 1), tokens.flatten())

    plain = tiny_model(tiny_cfg)
    convert_to_float8_training(plain, config=Float8LinearConfig.from_recipe_name("rowwise_with_gw_hp"),
                               module_filter_fn=lambda _m, fqn: fqn != "output")
    with pytest.raises(RuntimeError, match="same dtype"):
        loss_of(plain, torch.autocast("cpu", dtype=torch.bfloat16)).backward()

    recipe = build_recipe(PrecisionConfig(name="fp8_rowwise_gw_hp", hp_dtype="bf16", keep_hp=EVERY_ALIGNED),
                          device_type="cpu")
    ours = recipe.prepare(tiny_model(tiny_cfg))
    loss_of(ours, recipe.autocast()).backward()
    grads = [p.grad for p in ours.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert all(g.dtype == torch.float32 for g in grads)  # fp32 master weights keep fp32 grads


# ---------------------------------------------------------------------------- capability
@pytest.mark.parametrize("precision", FP8_PRECISIONS)
def test_fp8_capability_table(precision):
    with pytest.raises(ValueError) as info:
        check_precision_supported(precision, device="cuda", capability=(8, 6), device_name="NVIDIA A10G")
    msg = str(info.value)
    assert "precision.fp8_impl=emulated" in msg and f"precision={precision}" in msg
    assert "NVIDIA A10G" in msg and "8.6" in msg and "8.9" in msg

    # emulated: casts only, matmuls in bf16, which needs Ampere (8.0)
    check_precision_supported(precision, device="cuda", capability=(8, 0), device_name="A100", emulated=True)
    with pytest.raises(ValueError, match="8.0") as info:
        check_precision_supported(precision, device="cuda", capability=(7, 5), device_name="T4",
                                  emulated=True)
    assert "precision.hp_dtype=fp32" in str(info.value)
    # ... and with fp32 matmuls any GPU studies the FP8 numerics
    check_precision_supported(precision, device="cuda", capability=(7, 0), device_name="V100",
                              emulated=True, hp_dtype="fp32")

    for capability in [(8, 9), (9, 0)]:  # Ada, Hopper: FP8 tensor cores
        check_precision_supported(precision, device="cuda", capability=capability, device_name="H100")


def test_every_mode_runs_on_cpu_and_has_a_cuda_requirement():
    for precision in PRECISIONS:
        check_precision_supported(precision, device="cpu", emulated=True)
        if precision not in ROWWISE or cpu_rowwise_scaled_mm():
            check_precision_supported(precision, device="cpu")
    assert set(PRECISIONS) <= set(MIN_CUDA_CAPABILITY)


@pytest.mark.parametrize("precision", ROWWISE)
def test_native_rowwise_on_a_cpu_torch_without_its_matmul_is_refused_naming_the_fix(precision, monkeypatch,
                                                                                   tiny_cfg):
    monkeypatch.setattr(precision_capability, "cpu_rowwise_scaled_mm", lambda: False)  # torch 2.11's CPU
    overrides = TINY_RUN + [f"precision={precision}"]  # cluster.device=cpu
    with pytest.raises(ValueError) as info:
        check_device(compose_run_config(overrides))
    msg = str(info.value)
    assert f"precision={precision}" in msg and "precision.fp8_impl=emulated" in msg
    assert "precision=fp8_tensorwise" in msg and torch.__version__ in msg
    # emulated, and the modes with per-tensor scales, still run
    assert check_device(compose_run_config(overrides + ["precision.fp8_impl=emulated"])) == "cpu"
    assert check_device(compose_run_config(TINY_RUN + ["precision=fp8_tensorwise"])) == "cpu"
    recipe = build_recipe(PrecisionConfig(name=precision), device_type="cpu")
    with pytest.raises(ValueError, match="precision.fp8_impl=emulated"):  # a worker's own torch
        recipe.prepare(tiny_model(tiny_cfg))


def test_the_cpu_rowwise_probe_says_what_torchaos_rowwise_linear_does(tiny_cfg, float8_linear):
    """The probe's answer is what a native rowwise FP8 layer meets on this CPU: it runs
    (torch 2.13) or torch's _scaled_mm fails an internal assert (2.11)."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    model = convert_to_float8_training(nn.Sequential(nn.Linear(32, 16)),
                                       config=Float8LinearConfig.from_recipe_name("rowwise"))
    try:
        model(torch.randn(16, 32)).sum().backward()
        ran = True
    except RuntimeError as e:
        assert "per-tensor scaling" in str(e)
        ran = False
    assert cpu_rowwise_scaled_mm() is ran


# ---------------------------------------------------------------------------- MFU
def test_throughput_reports_mfu_against_both_peaks():
    hp, fp8 = Peak(2e12, "table:test:bf16"), Peak(8e12, "table:test:fp8")
    perf = Throughput(tokens_per_step=4096, flops_per_token=6e6, peak=hp, world_size=2, fp8_peak=fp8).step()
    model_flops = perf["model_tflops"] * 1e12
    assert perf["mfu"] == pytest.approx(model_flops / (hp.flops_per_s * 2))
    assert perf["mfu_fp8"] == pytest.approx(model_flops / (fp8.flops_per_s * 2))
    assert perf["mfu"] == pytest.approx(4 * perf["mfu_fp8"])  # 4x the peak, a quarter of the MFU

    unknown = Throughput(tokens_per_step=4096, flops_per_token=6e6, peak=hp, world_size=1,
                         fp8_peak=Peak(None, "unknown:x")).step()
    assert "mfu" in unknown and "mfu_fp8" not in unknown


def test_cpu_has_no_fp8_peak():
    peak = device_peak(torch.device("cpu"), "fp8")
    assert peak.flops_per_s is None and peak.source.startswith("unknown:")


def test_fp8_trial_on_cpu_reports_mfu_against_its_high_precision_peak_only(dist_info):
    # hp_dtype=fp32: the fp32 probe takes 0.3 s; a CPU without bf16 units probes bf16 for seconds
    run = compose_run_config(TINY_RUN + ["precision=fp8_tensorwise", "precision.hp_dtype=fp32",
                                         "train.max_steps=3"])
    tracker = RecordingTracker()
    trainer = build_trainer(plan_trial(run, Where(device=dist_info.device.type)), dist_info, tracker=tracker)  # the real CPU probe
    result = trainer.train()
    tflops, tps, mfu = (tracker.by_step(k) for k in (names.MODEL_TFLOPS, names.TOKENS_PER_S, names.MFU))
    assert sorted(tflops) == sorted(tps) == sorted(mfu) == [1, 2, 3]
    assert all(v > 0 for v in [*tflops.values(), *tps.values()])
    # train/mfu is against the probed high-precision peak; CPU has no FP8 peak
    peak = trainer.throughput.peak
    assert peak.source == "probe:cpu:fp32" and peak.flops_per_s > 0
    for step in mfu:
        assert mfu[step] == pytest.approx(tflops[step] * 1e12 / peak.flops_per_s)
    assert result.mfu is not None and 0 < result.mfu < 1
    assert names.MFU_FP8 not in tracker.keys()


# ---------------------------------------------------------------------------- tags
def test_layer_tags_record_the_plan(tiny_cfg, float8_linear):
    # the plan is the same emulated; torch 2.11's CPU runs rowwise emulated only
    cfg = PrecisionConfig(name="fp8_rowwise", keep_hp=["first_block", "output"], hp_dtype="fp32",
                          fp8_impl="native" if cpu_rowwise_scaled_mm() else "emulated")
    recipe = build_recipe(cfg, device_type="cpu")
    model = recipe.prepare(tiny_model(tiny_cfg))
    tags = _layer_tags(recipe)
    kept = [n for n, m in model.named_modules() if type(m) is nn.Linear]
    n_fp8 = sum(isinstance(m, float8_linear) for m in model.modules())
    assert tags[names.TAG_FP8_LAYERS] == recipe.plan.summary == f"{n_fp8}/{N_LINEARS}"
    # grouped by the entry that kept them
    assert tags[names.TAG_HP_LAYERS] == f"first_block: {','.join(kept[:-1])}; output: output"
    assert kept[-1] == "output" and len(kept) == PER_BLOCK + 1
    assert tags[names.TAG_FP8_ALL_GATHER].startswith("false: ")  # rowwise; and no FSDP2 here

    everything = dataclasses.replace(cfg, keep_hp=[])
    recipe = build_recipe(everything, device_type="cpu")
    recipe.prepare(tiny_model(tiny_cfg))
    tags = _layer_tags(recipe)
    assert (tags[names.TAG_FP8_LAYERS], tags[names.TAG_HP_LAYERS]) == (f"{N_LINEARS}/{N_LINEARS}", "-")
    # modes without a layer plan tag nothing
    assert _layer_tags(build_recipe(PrecisionConfig(name="bf16"), device_type="cpu")) == {}
