"""model=hf's inputs as a user meets them going wrong: a model folder whose config.json names code to
run, weights cut short or damaged or of another shape than config.json says, a config.json
deeper than any machine holds, an activation or a number transformers cannot use. Each is one
ValueError on the driver, before Ray or any worker, naming the file, the key or tensor, the value
and a fix that works (config.json overrides model.*: no fix may name a model.* field).

Called in-process through the driver's own checks (config.hf_model when the run is composed,
models.hf_checks.check_hf_model from launch.preflight.check_data, the preflight's size check);
tests/integration/test_hf_model_cli.py runs a few through the CLI."""

from __future__ import annotations

import json
import shutil
import struct
import time

import pytest
import torch

from trainlab.config import ConfigError, compose_run_config
from trainlab.config.schema import ModelConfig
from trainlab.models.hf_checks import check_hf_model
from trainlab.models.hf_demo import write_demo_model
from trainlab.models.hf_weights import load_pretrained

EVIL_CODE = "import pathlib\npathlib.Path({marker!r}).write_text('the folder ran its code')\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    root = tmp_path_factory.mktemp("hfmodel")
    return {f: write_demo_model(root / f, family=f, vocab_size=300) for f in ("llama", "qwen2", "gpt_neox")}


def _copy(demo, tmp_path, family="llama", *, edit=None, name="m"):
    out = tmp_path / name
    shutil.copytree(demo[family], out)
    if edit:
        cfg = json.loads((out / "config.json").read_text())
        edit(cfg)
        (out / "config.json").write_text(json.dumps(cfg))
    return out


def _refusal(folder, *, field="pretrained") -> str:
    with pytest.raises(ValueError) as e:
        check_hf_model(ModelConfig(name="hf", **{field: str(folder)}))
    msg = str(e.value)
    assert "\n" not in msg and "model.n_layers" not in msg and "model.dim" not in msg, msg
    return msg


# ---------------------------------------------------------------- a folder's own code never runs
def _with_code(demo, tmp_path, *, model_type: str):
    marker = tmp_path / "ran"

    def edit(cfg):
        cfg["model_type"] = model_type
        cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel"}

    folder = _copy(demo, tmp_path, edit=edit)
    (folder / "evil.py").write_text(EVIL_CODE.format(marker=str(marker)))
    return folder, marker


def test_a_folder_naming_its_own_code_is_refused_without_a_prompt_and_its_code_never_runs(demo, tmp_path, capfd,
                                                                                       monkeypatch):
    from trainlab.models import build_model

    folder, marker = _with_code(demo, tmp_path, model_type="evilnet")
    monkeypatch.setattr("builtins.input", lambda *a: "y")  # a user who would answer yes to transformers' prompt
    msg = _refusal(folder)
    assert f"model.pretrained='{folder}'" in msg and "model_type='evilnet'" in msg and "auto_map" in msg, msg
    assert "evil.EvilConfig" in msg and "never runs a model folder's own code" in msg, msg
    with pytest.raises(ValueError, match="never runs a model folder's own code"), torch.device("meta"):
        build_model(ModelConfig(name="hf", config=str(folder / "config.json")), vocab_size=300)  # a worker's path
    out = capfd.readouterr()
    assert "[y/N]" not in out.out + out.err and "custom code" not in out.out + out.err
    assert not marker.exists()


def test_an_architecture_transformers_ships_is_built_by_its_own_classes_whatever_auto_map_says(demo, tmp_path):
    folder, marker = _with_code(demo, tmp_path, model_type="llama")
    check_hf_model(ModelConfig(name="hf", pretrained=str(folder)))
    assert not marker.exists()


# ---------------------------------------------------------------- the weights, from their headers
def _header_len(path) -> int:
    return struct.unpack("<Q", path.read_bytes()[:8])[0]


def _rewrite_header(path, change):
    raw = path.read_bytes()
    n = _header_len(path)
    header = json.loads(raw[8:8 + n])
    change(header)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


def _first_tensor(header) -> str:
    return min((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][0])


DAMAGE = {
    "empty": (lambda p: p.write_bytes(b""), ["is 0 bytes, too short to hold a safetensors header"]),
    "cut_in_header": (lambda p: p.write_bytes(p.read_bytes()[:1000]), ["begins with a header length of",
                                                                        "cut short"]),
    "cut_in_data": (lambda p: p.write_bytes(p.read_bytes()[:-100]), ["is cut short: its header places tensor",
                                                                      "bytes of data"]),
    "tail": (lambda p: p.write_bytes(p.read_bytes() + b"\0" * 8), ["8 bytes after its last tensor"]),
    "not_json": (lambda p: p.write_bytes(p.read_bytes()[:8] + b"{" * _header_len(p) + p.read_bytes()[8 + _header_len(p):]),
                 ["has a header that is not JSON"]),
    "range_not_dtype_x_shape": (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(shape=[3])),
                                ["F32 [3]: 12 bytes) the byte range", "the header is damaged"]),
    "unknown_dtype": (lambda p: _rewrite_header(p, lambda h: h[_first_tensor(h)].update(dtype="Q7")),
                      ['as dtype "Q7", which torch\'s safetensors reader cannot read']),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_damaged_weights_are_refused_naming_the_file_and_what_is_wrong(demo, tmp_path, damage):
    folder = _copy(demo, tmp_path)
    spoil, says = DAMAGE[damage]
    spoil(folder / "model.safetensors")
    msg = _refusal(folder)
    assert f"model.pretrained: model.safetensors in '{folder}'" in msg, msg
    for part in says + ["copy the model folder again", "save_pretrained"]:
        assert part in msg, msg


def test_weights_of_another_width_than_config_json_are_refused_naming_the_tensor_and_both_shapes(demo, tmp_path):
    folder = _copy(demo, tmp_path, edit=lambda c: c.update(hidden_size=128, head_dim=32))
    msg = _refusal(folder)
    assert "model.safetensors holds model.embed_tokens.weight as [300, 64], but its config.json (hidden_size=128" in msg
    assert "makes it [300, 128]" in msg and "point model.pretrained at the folder these weights were saved in" in msg


def test_a_config_deeper_than_its_weights_is_refused_at_the_first_missing_layer_in_milliseconds(demo, tmp_path):
    folder = _copy(demo, tmp_path, edit=lambda c: c.update(num_hidden_layers=100_000))
    start = time.perf_counter()
    msg = _refusal(folder)
    assert time.perf_counter() - start < 10, "the check built or scanned every layer"
    assert "hold no tensor model.layers.2.self_attn.q_proj.weight" in msg, msg
    assert "num_hidden_layers=100000; the weights hold 2 decoder layers" in msg, msg


def test_a_sharded_model_loads_and_a_missing_shard_is_refused_naming_the_index(demo, tmp_path):
    from transformers import AutoModelForCausalLM

    folder = tmp_path / "sharded"
    AutoModelForCausalLM.from_pretrained(demo["llama"], dtype=torch.float32).save_pretrained(
        folder, max_shard_size="200KB")
    shards = sorted(folder.glob("model-*.safetensors"))
    assert len(shards) > 1 and (folder / "model.safetensors.index.json").exists()
    cfg = ModelConfig(name="hf", pretrained=str(folder))
    check_hf_model(cfg)
    shards[-1].unlink()
    msg = _refusal(folder)
    assert f"model.safetensors.index.json in '{folder}' places tensor" in msg and shards[-1].name in msg, msg
    assert "the copy is incomplete" in msg, msg


def test_the_checks_pass_what_loads(demo):
    from trainlab.models import build_model
    from trainlab.models.init import materialize

    for folder in demo.values():
        cfg = ModelConfig(name="hf", pretrained=str(folder))
        check_hf_model(cfg)
    with torch.device("meta"):
        model = build_model(cfg, vocab_size=300)
    materialize(model, device="cpu", seed=0)
    assert load_pretrained(model, str(folder)) == len(list(model.parameters()))


# ---------------------------------------------------------------- config.json's keys
def test_an_unknown_activation_is_refused_naming_the_key_the_value_and_the_ones_transformers_knows(demo, tmp_path):
    for family in ("llama", "gpt_neox"):
        folder = _copy(demo, tmp_path, family, edit=lambda c: c.update(hidden_act="bogus"), name=family)
        msg = _refusal(folder)
        assert f"{folder / 'config.json'} has hidden_act=\"bogus\", an activation transformers does not know" in msg
        assert "silu" in msg and "gelu" in msg, msg


@pytest.mark.parametrize("key, value, want, removable", [
    ("rope_theta", None, "a number above 1", True),
    ("rope_theta", "10000", "a number above 1", True),
    ("rms_norm_eps", -1e-6, "a number above 0", True),
    ("initializer_range", float("nan"), "a number above 0", True),
    ("initializer_range", 0, "a number above 0", True),
    ("vocab_size", None, "a whole number of at least 1", False),
    ("intermediate_size", 1.5, "a whole number of at least 1", True),
    ("num_key_value_heads", -2, "a whole number of at least 1", True),
    ("num_key_value_heads", 3, "a divisor of num_attention_heads=4", False),
    ("head_dim", "16", "a whole number of at least 1", True),
    ("max_position_embeddings", None, "a whole number of at least 1", True),
    ("num_hidden_layers", True, "a whole number of at least 1", False),
    ("tie_word_embeddings", "no", "true or false", True),
    ("hidden_size", 66, "a multiple of num_attention_heads=4", False),
    ("rope_parameters", {"rope_theta": None, "rope_type": "default"}, "a number above 1", True),
])
def test_a_bad_number_in_config_json_is_one_line_naming_the_file_the_key_the_value_and_the_fix(
        demo, tmp_path, key, value, want, removable):
    """Where a missing key means transformers' default, removing it is the other fix (a null is no
    default: transformers' strict config classes reject it, or its rotary table divides by it)."""
    folder = _copy(demo, tmp_path, edit=lambda c: c.update({key: value}))
    with pytest.raises(ValueError) as e:
        ModelConfig(name="hf", pretrained=str(folder))
    msg = str(e.value)
    shown = "rope_parameters.rope_theta=null" if key == "rope_parameters" else f"{key}={json.dumps(value)}"
    assert msg.startswith(f"model.pretrained: {folder / 'config.json'} has {shown}; edit it there to {want}"), msg
    assert ("remove the key to take transformers' default" in msg) == removable, msg
    assert "\n" not in msg and "model.init_std" not in msg and "model.rope_theta" not in msg, msg


def test_a_value_transformers_rejects_is_named_with_the_key(demo, tmp_path):
    folder = _copy(demo, tmp_path, edit=lambda c: c.update(attention_dropout="lots"))
    msg = _refusal(folder)
    assert f"{folder / 'config.json'} has attention_dropout=\"lots\", which transformers rejects" in msg, msg
    assert "edit it there, or remove the key" in msg, msg


# ---------------------------------------------------------------- a config.json no machine holds
def test_a_config_too_deep_for_this_machine_is_refused_from_its_arithmetic_before_anything_builds_it(
        demo, tmp_path, monkeypatch):
    from trainlab.launch.preflight import preflight

    built = []
    monkeypatch.setattr("trainlab.models.build_model", lambda *a, **k: built.append(1))  # no full build
    for family in ("llama", "gpt_neox"):
        folder = _copy(demo, tmp_path, family, edit=lambda c: c.update(num_hidden_layers=100_000), name=family)
        (folder / "model.safetensors").unlink()
        run = compose_run_config(["model=hf", f"model.config={folder}", "data=text", "cluster.num_workers=1",
                                  "tracking=none", "precision.keep_hp=[output]", f"output_dir={tmp_path / 'out'}"])
        start = time.perf_counter()
        with pytest.raises(ConfigError) as e:
            preflight(run, tracking_uri=None, services=False)
        assert time.perf_counter() - start < 20, "the size check built the model"
        msg = str(e.value)
        assert f"model.config='{folder}' (its config.json: num_hidden_layers=100000, hidden_size=64)" in msg, msg
        assert "training it takes at least" in msg and "hold" in msg and "GB together" in msg, msg
        assert "fix: " in msg and "a config.json with fewer num_hidden_layers" in msg, msg
        assert "model.n_layers" not in msg and not built


@pytest.mark.parametrize("overrides", [
    ["model=tiny"], ["model=small", "parallel=fsdp", "cluster.num_workers=2"],
    ["model=small", "precision=bf16_pure", "parallel.activation_checkpoint=block"],
    ["model=tiny", "optim.exp_avg_dtype=e4m3", "optim.exp_avg_sq_dtype=e5m2", "parallel=pp", "parallel.pp=2",
     "cluster.num_workers=2"],
    ["model=tiny", "parallel=tp", "parallel.tp=2", "cluster.num_workers=2", "parallel.sequence_parallel=true"],
])
def test_the_arithmetic_never_asks_for_more_than_the_estimate(overrides):
    """The size check refuses from a lower bound: what it counts is at most what the estimate counts."""
    from trainlab.estimate.least_memory import least_memory
    from trainlab.estimate.trial_estimate import estimate_trial
    from trainlab.plan.derive_layout import plan_layout
    from trainlab.vocab.nodes import ClusterSpec

    run = compose_run_config([*overrides, "data=text"])
    layout = plan_layout(run)
    est = estimate_trial(run, ClusterSpec.of_nodes([f"{run.cluster.num_workers}xH100"]), trial_layout=layout)
    least = least_memory(run, trial_layout=layout)
    state = sum(r.memory.params + r.memory.grads + r.memory.optim_state for r in est.ranks)
    acts = sum(r.memory.activations for r in est.ranks)
    assert 0 < least.state <= state and 0 < least.activations <= acts, (least, state, acts)


def test_a_layout_fix_names_the_config_json_key_not_the_model_field_it_overrides(demo, tmp_path):
    from trainlab.models import resolve_dims
    from trainlab.parallel.tp import check_tp
    from trainlab.plan.derive_layout import plan_layout

    cfg = ModelConfig(name="hf", pretrained=str(demo["llama"]))
    with pytest.raises(ValueError) as e:
        check_tp(resolve_dims(cfg, vocab_size=300), 3)
    assert "or use a config.json with another num_attention_heads (model=hf takes model.n_heads" in str(e.value)
    folder = _copy(demo, tmp_path, edit=lambda c: c.update(num_hidden_layers=3))
    with pytest.raises(ValueError) as e:
        plan_layout(compose_run_config(["model=hf", f"model.config={folder}", "data=text", "parallel=pp",
                                        "parallel.pp=2", "cluster.num_workers=2"]))
    assert "use a config.json whose num_hidden_layers divides by 2" in str(e.value), str(e.value)
    assert "pick n_layers" not in str(e.value)
