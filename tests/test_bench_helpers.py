"""The simulator benchmark's helpers on a small model (the benchmark itself is not a test)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_simulate  # noqa: E402

from quantlab.simulate import Mode, Simulator  # noqa: E402


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.conv2 = nn.Conv2d(4, 4, 1)  # its input arrives quantized: a prepared fake quant
        self.head = nn.Linear(4 * 9, 2)

    def forward(self, x):
        h = torch.relu(self.conv2(self.conv(x)))
        return self.head(h.reshape(h.shape[0], -1).contiguous())  # layout ops: pass-through


def _after_a_fixed_run(net: type[nn.Module], x: tuple) -> Simulator:
    """A j6m Simulator of ``net()`` (seeded weights), calibrated on ``x``, after one FIXED run
    of it."""
    torch.manual_seed(0)
    sim = Simulator(net().eval(), "j6m")
    sim.calibrate([x], progress=False)
    sim.run(*x, mode=Mode.FIXED)
    return sim


def test_fake_quant_passes_and_the_captured_run_cover_a_model_with_layout_ops():
    torch.manual_seed(0)
    m = _Net().eval()
    x = (torch.randn(2, 3, 3, 3),)
    sim = Simulator(m, "j6m")
    sim.calibrate([x], progress=False)
    for _ in range(2):
        sim.run(*x, mode=Mode.FAKE)
    assert any(p.passes for p in sim._prepared.values())  # a pass-through op was prepared
    assert any(not p.passes for p in sim._prepared.values())
    bench_simulate.fake_quant_passes(sim)()  # only the ops with a fake quant
    with torch.no_grad():
        want = m(*x)
    assert torch.equal(bench_simulate.captured_runner(m, x)(), want)


def test_the_profile_names_functions_by_package_path_and_counts_calls_per_run():
    import profile_stages

    where = profile_stages._where
    assert where("~", 0, "<built-in method torch.conv2d>") == "<built-in method torch.conv2d>"
    lib = "/env/lib/python3.11/site-packages/torch/nn/modules/module.py"
    assert where(lib, 1782, "_call_impl") == "_call_impl (torch/nn/modules/module.py:1782)"
    own = "/home/u/quantlab/quantlab/simulate/steady.py"  # the package folder, not the checkout
    assert where(own, 81, "prepared_value") == "prepared_value (quantlab/simulate/steady.py:81)"
    assert where("/elsewhere/x.py", 3, "f") == "f (/elsewhere/x.py:3)"

    m = _Net().eval()
    x = (torch.randn(2, 3, 3, 3),)
    sim = Simulator(m, "j6m")
    sim.calibrate([x], progress=False)
    sim.run(*x, mode=Mode.FAKE)
    table = profile_stages.python_table(lambda: sim.run(*x, mode=Mode.FAKE), runs=3, rows=200)
    assert list(table.columns) == ["function", "calls per run", "own ms per run", "share"]
    by_name = table.set_index("function")["calls per run"]
    dispatch = [f for f in by_name.index if f.startswith("_dispatch (quantlab/simulate/")]
    assert len(dispatch) == 1 and by_name[dispatch[0]] == len(sim.ops)  # once per op per run
    assert 0.0 < table["share"].sum() <= 1.0 + 1e-9


def test_the_fixed_stages_count_every_exact_gemm():
    """A fixed run's convolutions (prepared convs) and linear (int_linear) both count in the
    stage "exact GEMM sums", which is the planned kernels' time."""
    import profile_stages

    from quantlab.numerics.gemm import kernels

    x = (torch.randn(2, 3, 3, 3),)
    sim = _after_a_fixed_run(_Net, x)
    stats = profile_stages.cprofile_stats(lambda: sim.run(*x, mode=Mode.FIXED), runs=2)
    planned = {name: v for (file, _, name), v in stats.items() if file == kernels.__file__}
    assert planned["conv_planned"][1] == 4 and planned["matmul_planned"][1] == 2
    kernels_ms = (planned["conv_planned"][3] + planned["matmul_planned"][3]) * 1e3 / 2
    table = profile_stages.stage_rows(stats, 2).set_index("stage")
    assert table.loc["exact GEMM sums", "ms per run"] == pytest.approx(kernels_ms)


def test_the_switch_loop_and_the_checks_line_read_a_switched_program(monkeypatch):
    from quantlab.simulate import steady_programs

    monkeypatch.setattr(steady_programs, "PROGRAM_AFTER_S", 0.05)
    torch.manual_seed(0)
    m = _Net().eval()
    x = (torch.randn(2, 3, 3, 3),)
    sim = Simulator(m, "j6m")
    sim.calibrate([x], progress=False)

    def fake():
        return sim.run(*x, mode=Mode.FAKE)

    switch = bench_simulate.run_until_switched(fake, sim, x, Mode.FAKE)
    assert switch["switched"] and switch["failed"] is None
    assert switch["captured_runs"] >= 1 and switch["captured_s"] >= 0.05
    program = sim.steady_programs.status(x, Mode.FAKE).program
    line = bench_simulate.checks_line(fake, program, x, runs=3)
    checks, guards = [float(w) for w in line.split() if w.isdigit()][:2]
    assert checks > 0 and guards > 0
    assert sim.steady_programs.status(x, Mode.FAKE).program_runs >= 3


def test_the_step_table_times_a_programs_steps_by_op_type(monkeypatch):
    """Every step of a switched FIXED program is counted once per run under its op type, the
    rows and what is outside the steps add up to the runs' wall time, and the steps' classes
    are left as they were."""
    import profile_stages

    from quantlab.simulate import program_steps, steady_programs

    monkeypatch.setattr(steady_programs, "PROGRAM_AFTER_S", 0.05)
    x = (torch.randn(2, 3, 3, 3, generator=torch.Generator().manual_seed(1)),)
    sim = _after_a_fixed_run(_Net, x)

    def fixed():
        return sim.run(*x, mode=Mode.FIXED)

    assert bench_simulate.run_until_switched(fixed, sim, x, Mode.FIXED)["switched"]
    before = {c: c.__call__ for c in (program_steps._Prepared, program_steps._Full)}
    table = profile_stages.step_table(sim, fixed, runs=3).set_index("op type")
    assert {c: c.__call__ for c in before} == before
    counts = sim.ops.op_type.value_counts()
    for op in ("conv2d", "linear", "relu", "reshape", "contiguous"):
        assert table.loc[op, "calls per run"] == counts[op], op
    assert (table["ms per run"] >= 0).all()
    assert table["share"].sum() == pytest.approx(1.0)


class _Chain(nn.Module):
    """conv -> functional relu (an op of the root module) -> conv -> functional add -> linear,
    then a functional op after the last leaf module."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(3, 4, 1)
        self.b = nn.Conv2d(4, 4, 1)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = self.b(h) + h
        return self.head(h.mean((2, 3))) * 2.0


def test_the_sensitivity_floor_reads_each_ops_share_from_the_next_whole_leaf_module():
    import bench_sensitivity

    model = _Chain().eval()
    x = torch.randn(2, 3, 5, 5)
    sim = Simulator(model, "j6m")
    sim.run(x, mode=Mode.FLOAT)
    order = list(sim.ops["name"])
    leaf = bench_sensitivity._leaf_op_modules(model, order)
    assert sorted(leaf.values()) == ["a", "b", "head"]  # the root's functional ops are not
    assert all(order[i].split(":")[0] == p for i, p in leaf.items())
    eager_s, shares = bench_sensitivity.eager_suffix_shares(model, (x,), order, order, rounds=5)
    assert eager_s > 0
    values = [shares[n] for n in order]
    assert all(0 <= v <= 1 for v in values)
    # later ops have smaller shares; an op reads the share of the next leaf op at or after it
    assert values == sorted(values, reverse=True)
    i_relu = next(i for i, n in enumerate(order) if ":relu" in n)
    assert shares[order[i_relu]] == shares[order[i_relu + 1]]  # relu reads b's start
    assert shares[order[-1]] == 0.0  # no leaf module after the last op
    assert shares[order[0]] > shares[order[-2]] > 0  # a starts before head does


def test_the_requant_benchmark_times_the_forms_it_names():
    """bench_ort_requant's integer form computes what its report says: ConvInteger's sums times
    the per-channel multiplier, plus half, divided (truncating) by the unit, clipped to int8;
    both forms run and give the layer's output shape."""
    import bench_ort_requant as B
    from onnx import numpy_helper

    qlinear, integer = B._models(4, 6, 3, 2, 9, 1)
    x = torch.randint(0, 256, (1, 4, 9, 9), generator=torch.Generator().manual_seed(0))
    x = x.to(torch.uint8).numpy()
    yq = B._session(qlinear, 1).run(None, {"x": x})[0]
    yi = B._session(integer, 1).run(None, {"x": x})[0]
    assert yq.shape == yi.shape == (1, 6, 5, 5)
    init = {t.name: numpy_helper.to_array(t) for t in integer.graph.initializer}
    xs = torch.from_numpy(x.astype("int64")) - int(init["xz"])
    w = torch.from_numpy(init["w"].astype("int64"))
    acc = torch.nn.functional.conv2d(xs.double(), w.double(), stride=2, padding=1).long()
    p = acc * torch.tensor(init["m"]) + int(init["half"])
    want = torch.div(p, int(init["unit"]), rounding_mode="trunc").clamp(-128, 127)
    assert torch.equal(torch.from_numpy(yi.astype("int64")), want)


class _Separable(nn.Module):
    """A depthwise 3x3 convolution then a 1x1 one: the fixed run's depthwise sums, int8
    matrix product and multiply-and-shift requantization."""

    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pw = nn.Conv2d(16, 32, 1)

    def forward(self, x):
        return self.pw(torch.relu(self.dw(x)))


@pytest.mark.usefixtures("int8_product_fast")
def test_the_integer_kernels_alone_replay_a_fixed_runs_kernel_calls():
    from quantlab.numerics.gemm import depthwise_native, requant_native

    if requant_native.KERNELS.lib() is None or not depthwise_native.available():
        pytest.skip("no C compiler: the fixed run takes the torch forms")
    x = (torch.randn(1, 16, 8, 8),)
    sim = _after_a_fixed_run(_Separable, x)
    counted = {name: 0 for _, name in bench_simulate.KERNEL_SITES}
    with pytest.MonkeyPatch.context() as mp:  # an independent count of one run's calls
        for mod, name in bench_simulate.KERNEL_SITES:
            fn = getattr(mod, name)

            def spy(*a, _fn=fn, _name=name, **k):
                counted[_name] += 1
                return _fn(*a, **k)

            mp.setattr(mod, name, spy)
        sim.run(*x, mode=Mode.FIXED)
    assert all(n >= 1 for n in counted.values())
    before = [getattr(mod, name) for mod, name in bench_simulate.KERNEL_SITES]
    replay = bench_simulate.integer_kernels(lambda: sim.run(*x, mode=Mode.FIXED))
    assert [getattr(mod, name) for mod, name in bench_simulate.KERNEL_SITES] == before
    assert replay.calls == counted

    def refuse(*a, **k):
        raise AssertionError("the replay looked the kernel up again")

    with pytest.MonkeyPatch.context() as mp:  # the replay calls the functions it recorded
        for mod, name in bench_simulate.KERNEL_SITES:
            mp.setattr(mod, name, refuse)
        replay()


def test_every_benchmark_onnxruntime_session_sleeps_when_idle():
    """The onnxruntime baselines of the benchmarks (the GEMM one-node models, the requantization
    layers, the exported networks) run with spinning off, on the threads asked for, so an idle
    worker does not steal the next timing."""
    import bench_gemm
    import bench_ort_requant
    import numpy as np
    from ort_baseline import session

    w = np.ones((4, 4, 3, 3), dtype=np.int8)
    qlinear, _ = bench_ort_requant._models(4, 6, 3, 2, 9, 1)
    sessions = [
        bench_gemm._ort_session("QLinearConv", 2, (1, 4, 5, 5), w, np.ones(4, np.float32)),
        bench_ort_requant._session(qlinear, 2),
        session(qlinear.SerializeToString(), 2),
    ]
    for s in sessions:
        opts = s.get_session_options()
        assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert opts.intra_op_num_threads == 2
