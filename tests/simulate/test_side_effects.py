"""A Simulator leaves the user's model and torch's global state as it found them.

The model: same parameter and buffer objects with the same bits, the same hooks and attributes,
each module's train flag as it was (runs happen in eval mode). Torch: the global RNG state,
thread count, grad mode, global module hooks, ``nn.Module._call_impl`` (which a capture wraps
while it runs) and the torch-function mode stack.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from bits import assert_bits_equal
from torch import nn

from quantlab.models import build_model
from quantlab.models.schema import ModelConfig
from quantlab.simulate import Mode, Simulator, View


class UserNet(nn.Module):
    """A model as a user brings it: BatchNorm and Dropout, in train mode, with its own hook."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(8, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        y = F.relu6(self.bn(self.conv(x)))
        return torch.sigmoid(self.head(self.drop(y.mean((2, 3)))))


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).clone()


def _model_state(model: nn.Module) -> dict:
    tensors = model.state_dict(keep_vars=True)
    return {
        "objects": {k: id(v) for k, v in tensors.items()},
        "bits": {k: (v.dtype, tuple(v.shape), _bits(v)) for k, v in tensors.items()},
        "requires_grad": {k: v.requires_grad for k, v in tensors.items()},
        "training": {n: m.training for n, m in model.named_modules()},
        "attributes": {n: sorted(vars(m)) for n, m in model.named_modules()},
        "hooks": {
            n: [
                list(getattr(m, h))
                for h in (
                    "_forward_hooks",
                    "_forward_pre_hooks",
                    "_backward_hooks",
                    "_backward_pre_hooks",
                    "_state_dict_hooks",
                    "_load_state_dict_pre_hooks",
                )
            ]
            for n, m in model.named_modules()
        },
    }


def _torch_state() -> dict:
    mod = nn.modules.module
    return {
        "rng": _bits(torch.get_rng_state()),
        "initial_seed": torch.initial_seed(),
        "threads": torch.get_num_threads(),
        "grad": torch.is_grad_enabled(),
        "function_modes": torch._C._len_torch_function_stack(),
        "module_call": nn.Module.__dict__["_call_impl"],  # the tracker's wrapper is gone
        "global_hooks": [
            len(getattr(mod, h))
            for h in (
                "_global_forward_hooks",
                "_global_forward_pre_hooks",
                "_global_backward_hooks",
                "_global_backward_pre_hooks",
                "_global_forward_hooks_always_called",
            )
        ],
    }


def _assert_same(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for key in before:
        if key == "bits":
            assert before[key].keys() == after[key].keys()
            for name, (dt, shape, bits) in before[key].items():
                assert after[key][name][:2] == (dt, shape), name
                assert_bits_equal(after[key][name][2], bits)
        elif key == "rng":
            assert_bits_equal(after[key], before[key])
        else:
            assert after[key] == before[key], key


def test_simulator_leaves_the_model_and_torch_as_they_were():
    torch.manual_seed(0)
    model = UserNet().train()
    model.drop.eval()  # a mixed train/eval state must come back as it was
    seen = []
    model.head.register_forward_hook(lambda mod, args, out: seen.append(out.shape))
    with torch.no_grad():
        model.bn.running_var.uniform_(0.5, 2.0)
    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(123)
    model_before, torch_before = _model_state(model), _torch_state()

    sim = Simulator(model, "j6m")
    sim.calibrate([(x,), (x * 0.5,)], progress=False)
    y_float = sim.run(x, mode=Mode.FLOAT)
    for mode in (Mode.FAKE, Mode.FIXED):
        sim.run(x, mode=mode)
    sim.trace(x, mode=Mode.FIXED)
    sim.compare(x, a=Mode.FAKE, b=Mode.FIXED, view=View.ISOLATED)

    _assert_same(model_before, _model_state(model))
    _assert_same(torch_before, _torch_state())
    assert len(seen) >= 5  # the user's own hook stayed and saw every run
    # the runs used eval semantics (BatchNorm running statistics, no Dropout)
    with torch.no_grad():
        want = model.eval()(x)
    assert_bits_equal(y_float, want)


def test_build_model_leaves_the_global_rng_alone():
    torch.manual_seed(7)
    before = _torch_state()
    first = build_model("small_cnn", seed=3)
    build_model(ModelConfig(name="detr_decoder", pretrained=False), seed=3)
    _assert_same(before, _torch_state())
    again = build_model("small_cnn", seed=3)
    same_seed = zip(first.module.state_dict().values(), again.module.state_dict().values())
    for a, b in same_seed:  # the seed alone decides the weights, whatever the global RNG did
        assert_bits_equal(b, a)
