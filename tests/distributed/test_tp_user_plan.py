"""model.tp_plan with real gloo process groups: a user's own module (tests/custom_model.py, GPT-style
names, q/k/v apart) sharded 2 ways by a plan written as config trains like one process, every
parameter a DTensor (the listed linears sharded, the rest replicated), and a module its plan
cannot handle is refused naming model.tp_plan. One spawn of 2 ranks runs every case."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import every_rank
from custom_model import TP_PLAN, build_split

pytestmark = pytest.mark.distributed

WORLD, STEPS, SEQ, VOCAB = 2, 4, 16, 64


def _build():
    torch.manual_seed(0)
    return build_split(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4, max_seq_len=SEQ)


def _train(model, batches):
    """The trainer's step: full logits, the loss, global-norm clipping (trainlab's), AdamW."""
    from trainlab.parallel.tp import clip_grads_with_norm_

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-6)
    losses, norms = [], []
    for batch in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        loss.backward()
        params = list(model.parameters())
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        clip_grads_with_norm_(params, 0.5, norm)
        optimizer.step()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
    return losses, norms


class _OwnsAndHolds(nn.Module):
    """A module with a parameter of its own and a child with parameters: not replicable apart."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(8))
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return self.fc(x) * self.scale


def _rank_main() -> dict:
    from torch.distributed.device_mesh import init_device_mesh

    from trainlab.parallel.tp import apply_tp

    mesh = init_device_mesh("cpu", (WORLD,), mesh_dim_names=("tp",))
    g = torch.Generator().manual_seed(1)  # the same batches on every TP rank
    # counting from a random start: something to learn in a few steps
    batches = [(torch.randint(0, VOCAB, (2, 1), generator=g) + torch.arange(SEQ + 1)) % VOCAB for _ in range(STEPS)]
    ref_model = _build()
    ref = _train(ref_model, batches)
    model = apply_tp(_build(), mesh=mesh, user_plan=TP_PLAN)
    placements = {n: str(getattr(p, "placements", None)) for n, p in model.named_parameters()}
    out = {"ref": ref, "tp": _train(model, batches), "placements": placements,
           "param_diff": max(float((p.detach().full_tensor() - r.detach()).abs().max())
                             for p, r in zip(model.parameters(), ref_model.parameters()))}
    for key, module, plan in (("root", _OwnsAndHolds(), {"fc": "rowwise"}),
                              ("inner", nn.Sequential(_OwnsAndHolds(), nn.Linear(8, 8)), {"1": "colwise"})):
        try:
            apply_tp(module, mesh=mesh, user_plan=plan)
        except ValueError as e:
            out[key] = str(e)
    return out


@pytest.fixture(scope="module")
def runs() -> dict:
    return every_rank(_rank_main, WORLD)


def test_your_plan_trains_like_one_process(runs):
    for result in runs.values():
        (ref_losses, ref_norms), (losses, norms) = result["ref"], result["tp"]
        assert ref_losses[-1] < ref_losses[0]  # it learns
        assert max(ref_norms) > 0.5            # clipping by the global norm is exercised
        assert losses == pytest.approx(ref_losses, rel=1e-5)
        assert norms == pytest.approx(ref_norms, rel=1e-5)
        assert result["param_diff"] < 1e-5


def test_listed_linears_are_sharded_and_every_other_parameter_replicated(runs):
    placements = runs[0]["placements"]
    for name, placement in placements.items():
        module, _, kind = name.rpartition(".")
        style = next((s for p, s in TP_PLAN.items() if module.endswith("." + p.rpartition(".")[2])), None)
        if style == "colwise":
            assert placement == "(Shard(dim=0),)", name
        elif style == "rowwise" and kind == "weight":
            assert placement == "(Shard(dim=1),)", name
        else:  # embeddings, norms, the head, a rowwise bias: replicated, still a DTensor
            assert placement == "(Replicate(),)", name


def test_a_module_the_plan_cannot_handle_is_refused_naming_it(runs):
    for result in runs.values():
        assert result["root"].startswith("model.tp_plan: the model itself (_OwnsAndHolds) owns parameters and "
                                         "has children with parameters (fc)")
        assert result["inner"].startswith("model.tp_plan: 0 owns parameters and has children with parameters (0.fc)")
