"""model=custom: the builder named by model._target_ gets the fields it names, and what cannot
work is refused before anything starts, naming model._target_ and the fix."""

from __future__ import annotations

import pytest
import torch

from conftest import RecordingTracker
from trainlab import names
from trainlab.config import compose_run_config
from trainlab.config.validate import check_run
from trainlab.engine.run import run_trial
from trainlab.models import build_model, num_params
from trainlab.plan.derive_layout import plan_layout
from trainlab.plan.here import plan_here

RUN = ["model=custom", "model._target_=custom_model.build", "model.dim=32", "model.n_layers=2", "model.n_heads=2",
       "data=text", "train.seq_len=32", "train.global_batch_size=4", "train.micro_batch_size=4",
       "train.max_steps=3", "train.eval_every=0", "train.eval_batches=1", "cluster.num_workers=1"]


def test_builder_gets_the_fields_it_names_and_the_corpus_vocabulary():
    run = compose_run_config(RUN)
    model = build_model(run.model, vocab_size=256)
    assert (model.wte.num_embeddings, model.wte.embedding_dim, len(model.layers)) == (256, 32, 2)
    assert model.wpe.num_embeddings == run.model.max_seq_len


def test_a_module_without_init_weights_is_built_for_real_from_the_seed():
    run = compose_run_config(RUN)
    with torch.device("meta"):
        torch.manual_seed(0)
        a = build_model(run.model, vocab_size=256)
        torch.manual_seed(0)
        b = build_model(run.model, vocab_size=256)
    assert not any(p.is_meta for p in a.parameters())
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))


def test_trains_and_counts_its_flops_from_its_own_parameters(one_thread, dist_info):
    from trainlab.engine.run import build_trainer

    run = compose_run_config(RUN)
    result = run_trial(plan_here(run), tracker_factory=lambda *_: RecordingTracker())
    assert result.status == names.STATUS_FINISHED
    trainer = build_trainer(plan_here(run), dist_info)
    own = build_model(run.model, vocab_size=256)
    assert trainer.throughput.flops_per_token == 6 * num_params(own, exclude_embedding=True)


@pytest.mark.parametrize("target, says", [
    ("custom_model.missing", r"model._target_='custom_model.missing': custom_model \(.*\) has no attribute 'missing'"),
    ("custom_model.not_a_module", r"returned a dict, not an nn.Module"),
    ("custom_model.no_blocks", r"without blocks in `.layers`"),
])
def test_a_builder_that_cannot_work_is_refused_naming_it(target, says):
    run = compose_run_config([*RUN, f"model._target_={target}"])
    with pytest.raises(ValueError, match=says):
        build_model(run.model, vocab_size=256)


BROKEN = {  # module name -> its source: what a user's builder can get wrong, checked on the driver
    "tl_import_raises": "raise RuntimeError('cannot find the CUDA toolkit')\n",
    "tl_needs_missing_dep": "import tl_not_installed_anywhere\n",
    "tl_builders": ("from torch import nn\nNOT_CALLABLE = 3\n"
                    "def build(vocab_size, dim):\n    raise ValueError('dim must be a power of two')\n"
                    "def needs_extra(vocab_size, foo):\n    return nn.Linear(2, 2)\n"),
}


@pytest.mark.parametrize("target, says", [
    ("tl_nowhere.build", "model._target_='tl_nowhere.build' cannot be imported: there is no module 'tl_nowhere' on "
                         "this Python's path; put the folder holding it on PYTHONPATH"),
    ("tl_builders.nope", "model._target_='tl_builders.nope': tl_builders ("),
    ("tl_builders.nope", "has no attribute 'nope'; name the function that returns your nn.Module; its functions: "
                         "build, needs_extra"),
    ("tl_import_raises.build", "model._target_='tl_import_raises.build': importing tl_import_raises raised "
                               "RuntimeError: cannot find the CUDA toolkit; fix that module"),
    ("tl_needs_missing_dep.build", "importing tl_needs_missing_dep raised ModuleNotFoundError: No module named "
                                   "'tl_not_installed_anywhere'; install what it imports"),
    ("tl_builders.NOT_CALLABLE", "model._target_='tl_builders.NOT_CALLABLE' is an int, not a function"),
    ("tl_builders.build", "model._target_='tl_builders.build': building it with dim=32, vocab_size=256 raised "
                          "ValueError: dim must be a power of two; fix the builder or the model.* fields it reads"),
    ("tl_builders.needs_extra", "model._target_='tl_builders.needs_extra' takes foo, which no model.* field fills"),
    ("build", "model._target_='build' is not a dotted path to a function; name your builder as "
              "package.module.function"),
    ("custom_model.not_a_module", "returned a dict, not an nn.Module; return your module"),
])
def test_the_driver_imports_and_builds_your_module_before_anything_starts(target, says, tmp_path, monkeypatch):
    from trainlab.launch.preflight import check_data

    for name, source in BROKEN.items():
        (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    run = compose_run_config([*RUN, f"model._target_={target}"])
    with pytest.raises(ValueError) as info:
        check_data(run)  # preflight's: on the driver, before Ray or a worker
    assert says in str(info.value)
    assert "\n" not in str(info.value)


def test_a_module_in_the_working_directory_is_named_with_the_path_that_finds_it(tmp_path, monkeypatch):
    (tmp_path / "tl_here.py").write_text("def build(vocab_size):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=f"it is in the working directory, which the trainlab command does not "
                                         f"search: run PYTHONPATH={tmp_path} trainlab train"):
        build_model(compose_run_config([*RUN, "model._target_=tl_here.build"]).model, vocab_size=256)


@pytest.mark.parametrize("layout, says", [
    (["parallel=tp", "cluster.num_workers=2"], r"no tensor-parallel plan .*; give one in model.tp_plan .* or use data "
                                               r"parallelism \(parallel=ddp, zero1, zero2, fsdp"),
    (["parallel=pp", "cluster.num_workers=2"], r"no pipeline split .* \(parallel=ddp, zero1, zero2, fsdp")])
def test_tensor_parallel_without_a_plan_and_pipelines_are_refused_with_the_layouts_that_work(layout, says):
    with pytest.raises(ValueError, match=says):
        plan_layout(compose_run_config([*RUN, *layout]))


def test_model_hf_and_a_target_together_are_refused():
    with pytest.raises(ValueError, match="use model=custom for your own builder"):
        check_run(compose_run_config(["model=hf", "model._target_=custom_model.build", "model.config=x.json"]))


def test_estimate_says_it_does_not_estimate_your_module():
    from trainlab.estimate.shape import model_shape

    with pytest.raises(NotImplementedError, match="your own module is trained unestimated"):
        model_shape(compose_run_config(RUN))
