"""The digit transformers trained in the lab: held-out accuracy with its bootstrap interval,
deterministic training that leaves the global RNG alone, the ops each variant is made of."""

import io

import pytest
import torch

from quantlab.analysis.confidence import bootstrap
from quantlab.data import load_data
from quantlab.data.digits import TRAIN_ITEMS, digits
from quantlab.data.schema import DataConfig
from quantlab.models import build_model
from quantlab.models.digit_transformer import Attention, DigitTransformer, TokenNorm
from quantlab.models.tasks import Top1Accuracy
from quantlab.models.trained_digits import TrainRecipe, train

VARIANTS = ["digits_layernorm", "digits_dyt", "digits_sima"]


@pytest.mark.parametrize("name", VARIANTS)
def test_held_out_accuracy_with_confidence_interval(name):
    """Each variant classifies the 597 held-out digits (writers after the training pool) with
    accuracy >= 0.85 and a 95% bootstrap interval whose lower end is >= 0.80."""
    bundle = build_model(name)
    assert bundle.task == Top1Accuracy() and bundle.default_data == "digits"
    data = load_data(DataConfig(name="digits", num_eval=597, batch_size=200), name)
    with torch.no_grad():
        outs = [bundle.module(*b) for b in data.eval]
    est = bootstrap(bundle.task, outs, outs, data.labels, resamples=300)
    assert est.n == 597
    assert est.value >= 0.85 and est.low >= 0.80, str(est)


def test_training_is_deterministic_and_leaves_the_global_rng_alone():
    def fresh() -> DigitTransformer:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(3)
            return DigitTransformer(TokenNorm.DYT, Attention.SIMA, dim=16, heads=2, depth=1)

    recipe = TrainRecipe(epochs=1, batch=200)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b = fresh(), fresh()
    la, lb = train(a, 5, recipe), train(b, 5, recipe)
    assert torch.equal(torch.rand(1), before), "training must not consume the global RNG"
    assert la == lb and all(torch.equal(a.state_dict()[k], v) for k, v in b.state_dict().items())
    assert la[0] < 2.4  # one epoch already beats chance (ln 10 = 2.30 at the start)


def test_trained_weights_are_one_thread_weights_and_leave_the_thread_count(monkeypatch):
    """The registry's trained weights equal training on one intra-op thread, whatever the
    caller's thread count (here 3), and building them never sets the caller's count."""
    from quantlab.models import trained_digits as td

    real_set = torch.set_num_threads
    threads = torch.get_num_threads()
    try:
        real_set(3)
        calls = []
        monkeypatch.setattr(torch, "set_num_threads", calls.append)
        built = torch.load(io.BytesIO(td._train_in_child("digits_dyt", 0)), weights_only=True)
        assert calls == [] and torch.get_num_threads() == 3
        real_set(1)
        one = td.train_state("digits_dyt", 0)
    finally:
        real_set(threads)
    assert built.keys() == one.keys()
    assert all(torch.equal(built[k], one[k]) for k in one)


def test_trained_weights_are_cached_on_disk_by_key(monkeypatch, tmp_path):
    """A second process (here: the uncached function) loads the stored weights instead of
    training; another seed or recipe has another key; a damaged file is trained anew."""
    from quantlab.models import trained_digits as td

    trained = []

    def fake_train(variant, seed):
        trained.append((variant, seed))
        buf = io.BytesIO()
        torch.save({"w": torch.full((2,), float(seed))}, buf)
        return buf.getvalue()

    monkeypatch.setattr(td, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(td, "_train_in_child", fake_train)
    first = td._trained_state.__wrapped__("digits_dyt", 3)
    again = td._trained_state.__wrapped__("digits_dyt", 3)
    assert trained == [("digits_dyt", 3)] and torch.equal(first["w"], again["w"])
    assert td.cache_key("digits_dyt", 3) != td.cache_key("digits_dyt", 4)
    assert td.cache_key("digits_dyt", 3) != td.cache_key("digits_dyt", 3, TrainRecipe(epochs=2))
    (file,) = tmp_path.iterdir()
    file.write_bytes(b"not a tensor file")
    td._trained_state.__wrapped__("digits_dyt", 3)
    assert len(trained) == 2


def test_variants_are_made_of_their_ops():
    seen: dict[str, set] = {}

    class Spy(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            seen[name].add(getattr(func, "__name__", str(func)))
            return func(*args, **(kwargs or {}))

    x = torch.rand(2, 8, 8)
    for name in VARIANTS:
        seen[name] = set()
        model = build_model(name).module
        with torch.no_grad(), Spy():
            assert model(x).shape == (2, 10)
    assert {"layer_norm", "softmax", "embedding"} <= seen["digits_layernorm"]
    assert "tanh" in seen["digits_dyt"] and "layer_norm" not in seen["digits_dyt"]
    assert "reciprocal" in seen["digits_sima"] and "softmax" not in seen["digits_sima"]


def test_digits_split_is_fixed_and_disjoint():
    images, labels = digits()
    assert images.shape == (1797, 8, 8) and 0 <= images.min() and images.max() <= 1
    assert torch.equal(images * 16, (images * 16).round())
    assert set(labels.tolist()) == set(range(10))
    d = load_data(DataConfig(name="digits", num_calib=30, num_eval=597, batch_size=100))
    assert d.calib_ids[-1] == "digit29" and d.eval_ids[0] == f"digit{TRAIN_ITEMS}"
    assert [len(b[0]) for b in d.eval] == [100] * 5 + [97]
    assert torch.equal(torch.cat(d.labels), labels[TRAIN_ITEMS:])
    with pytest.raises(ValueError, match="for models digits_layernorm"):
        load_data("digits", "mobilenet_v2")


def test_top1_accuracy_uses_labels_or_the_float_decisions():
    ref = [torch.tensor([[2.0, 1.0], [0.0, 1.0], [1.0, 0.0]])]
    test = [torch.tensor([[1.0, 2.0], [0.0, 1.0], [3.0, 0.0]])]
    assert Top1Accuracy()(ref, test, [torch.tensor([1, 1, 1])]) == pytest.approx(2 / 3)
    assert Top1Accuracy()(ref, test) == pytest.approx(2 / 3)  # agreement with ref's arg-max
    with pytest.raises(ValueError, match="labels hold 2 samples"):
        Top1Accuracy()(ref, test, [torch.tensor([1, 1])])
