"""Which quantlab profile gives this machine's onnxruntime bits.

onnxruntime's uint8 x int8 GEMM kernels on x86 CPUs without VNNI saturate each pair of
adjacent products to int16 (``gemm.pair_saturation``); elsewhere (VNNI, AMX, Arm) they sum
exactly. Asked of onnxruntime itself, once per process: one MatMulInteger whose only product
pair, 255 * 127 + 255 * 127 = 64770, does not fit in int16.
"""

from __future__ import annotations

import functools

import numpy as np

EXACT_PROFILE = "onnxruntime"
SATURATING_PROFILE = "onnxruntime_no_vnni"


@functools.cache
def onnxruntime_saturates_u8s8() -> bool:
    """True when this machine's onnxruntime sums uint8 x int8 products in saturated pairs."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from quantlab.export.runtime import session

    node = helper.make_node("MatMulInteger", ["a", "b"], ["y"])
    graph = helper.make_graph(
        [node],
        "pair_probe",
        [helper.make_tensor_value_info("a", TensorProto.UINT8, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [1, 1])],
        [numpy_helper.from_array(np.full((2, 1), 127, np.int8), "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    sess = session(model.SerializeToString())
    y = int(sess.run(None, {"a": np.full((1, 2), 255, np.uint8)})[0][0, 0])
    if y not in (64770, 32767):
        raise RuntimeError(f"onnxruntime's MatMulInteger probe gave {y}, neither 64770 nor 32767")
    return y == 32767


def onnxruntime_profile() -> str:
    """The profile matching this machine's onnxruntime: ``onnxruntime`` or, where its uint8 x
    int8 products saturate in pairs, ``onnxruntime_no_vnni``."""
    return SATURATING_PROFILE if onnxruntime_saturates_u8s8() else EXACT_PROFILE
