"""ONNX Runtime's float32 tanh, logistic (sigmoid), exp, erf and GELU as its MLAS kernels
compute them on x86 CPUs with AVX2 / FMA3 (exp and GELU: the AVX-512F kernels, which
onnxruntime picks on CPUs that have it), element by element. These are what a QDQ graph's
DequantizeLinear -> Tanh / Sigmoid / Exp / Erf / Gelu -> QuantizeLinear evaluates (the Sigmoid
group is fused into QLinearSigmoid, whose 256-entry table the same logistic kernel fills). On a
CPU with AVX2 / FMA3 and without AVX-512F onnxruntime 1.32 computes GELU as x / sqrt 2, its erf
kernel, 0.5 x (e + 1), which gives the AVX-512F kernel's bits (its erf takes the same steps and
constants; measured on an AMD EPYC without AVX-512), and exp with the FMA3 kernel, whose steps
give the same bits but for results below 2**-126 (it scales by 2**m in two roundings there;
read from its source, not measured on such a CPU).

Contract: float32 in, float32 out; every step one IEEE float32 operation (round to nearest
even) or one fused multiply-add (``fma.fma_float32``), in the kernels' order; the constants are
the kernels' float32 values. Checked against onnxruntime bit for bit on hundreds of thousands
of inputs (tests/runtime/test_ort_mlas_float32.py); the Fraction twin is
``quantlab.numerics.reference.mlas_float32`` (tests/numerics/test_mlas_float32.py).

* tanh: x clamped to [-9, 9]; x2 = fl32(x * x); p = x2 * a13 + a11, then p = p * x2 + a_k for
  a9 .. a1 (fma each); q = x2 * b6 + b4, then q * x2 + b2, q * x2 + b0 (fma); fl32(x * p) / q.
* logistic: x clamped to [-18, 18]; the same shape with a9 .. a1 and b10 .. b0, then
  max(fl32(fl32(x * p) / q) + 0.5, 0) (no upper clamp: the result may exceed 1 by an ulp).
* exp: x = max(x, -103.972084); m = fl32(fma(x, log2(e), 1.5 * 2**23) - 1.5 * 2**23) (x / ln 2
  rounded to an integer); r = fma(m, -ln2_hi, x), r = fma(m, -ln2_lo, r); p = fma chain of
  p0 .. p4 and two of 1.0 in r; the result p * 2**m rounded once (vscalefps).
* erf: a = min(|x|, 3.925); below 0.921875 an odd polynomial in a, a + a * P(a^2) (fma
  chain); above, 1 - exp(-Q(a)) with Q an fma chain in a and exp by the same steps as exp
  above with the erf kernel's own constants (input floored at -88.376); the sign of x restored.
  (Older onnxruntime releases capped |x| at 3.725.)
* GELU (exact, erf form): 0.5 x (1 + erf(x / sqrt 2)) as fl32(fl32(0.5 x) * fl32(e + 1)) with
  e = erf(fl32(x * 0.70710678)), erf as above.
"""

from __future__ import annotations

import torch
from torch import Tensor

from quantlab.numerics.fma import fma_float32


def _f32(*hex_values: str) -> tuple[Tensor, ...]:
    return tuple(torch.tensor(float.fromhex(h), dtype=torch.float32) for h in hex_values)


# MlasTanhConstants: range 9.0; alpha_13 .. alpha_1 (-2.76076847742355e-16, 2.00018790482477e-13,
# -8.60467152213735e-11, 5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
# 4.89352455891786e-03); beta_6 .. beta_0 (1.19825839466702e-06, 1.18534705686654e-04,
# 2.26843463243900e-03, 4.89352518554385e-03), each the float32 nearest its decimal
TANH_RANGE = 9.0
TANH_ALPHA = _f32(
    "-0x1.3e4b8p-52", "0x1.c266fcp-43", "-0x1.7a6ffep-34", "0x1.b80082p-25",
    "0x1.f28694p-17", "0x1.4e1bdap-11", "0x1.40b3b8p-8",
)  # fmt: skip
TANH_BETA = _f32("0x1.41a7b0p-20", "0x1.f12bacp-14", "0x1.29540ap-9", "0x1.40b3bap-8")

# MlasLogisticConstants: range 18.0; alpha_9 .. alpha_1 (4.37031012579801e-11,
# 1.15627324459942e-07, 6.08574864600143e-05, 8.51377133304701e-03, 2.48287947061529e-01);
# beta_10 .. beta_0 (6.10247389755681e-13, 5.76102136993427e-09, 6.29106785017040e-06,
# 1.70198817374094e-03, 1.16817656904453e-01, 9.93151921023180e-01)
LOGISTIC_RANGE = 18.0
LOGISTIC_ALPHA = _f32(
    "0x1.806aa2p-35", "0x1.f09d96p-24", "0x1.fe8276p-15", "0x1.16fab0p-7", "0x1.fc7e64p-3"
)
LOGISTIC_BETA = _f32(
    "0x1.5789eap-41", "0x1.8be4f6p-28", "0x1.a62fbap-18", "0x1.be2a7ep-10", "0x1.de7c30p-4",
    "0x1.fc7e68p-1",
)  # fmt: skip

# MlasExpConstants: LowerRange -103.9720840454, RoundingBias 12582912 (1.5 * 2**23),
# Log2Reciprocal 1.44269504088896341, Log2High -6.93145752e-1, Log2Low -1.42860677e-6,
# poly_0 .. poly_4 (hex in the source), poly_56 1.0
EXP_LOWER, EXP_BIAS, EXP_LOG2E, EXP_LN2_HI, EXP_LN2_LO = _f32(
    "-0x1.9fe36ap+6", "0x1.8p+23", "0x1.715476p+0", "-0x1.62e4p-1", "-0x1.7f7d1cp-20"
)
EXP_POLY = _f32("0x1.694p-10", "0x1.125edcp-7", "0x1.555b5ap-5", "0x1.55545p-3", "0x1.fffff6p-2")
ONE = torch.tensor(1.0, dtype=torch.float32)


def _horner(coeffs: tuple[Tensor, ...], x: Tensor) -> Tensor:
    """c0 x^n + ... + cn by Horner's rule, each step one fused multiply-add: p = fma(p, x, c)."""
    p = coeffs[0]
    for c in coeffs[1:]:
        p = fma_float32(p, x, c)
    return p


def _odd_rational(x: Tensor, alpha: tuple[Tensor, ...], beta: tuple[Tensor, ...]) -> Tensor:
    """fl32(fl32(x * P(x2)) / Q(x2)), P and Q by Horner's rule in fused multiply-adds."""
    x2 = x * x
    return (x * _horner(alpha, x2)) / _horner(beta, x2)


def mlas_tanh(x: Tensor) -> Tensor:
    """tanh as ``MlasComputeTanhF32KernelFma3`` computes it (float32; module doc)."""
    x = _as_float32(x).clamp(-TANH_RANGE, TANH_RANGE)
    return _odd_rational(x, TANH_ALPHA, TANH_BETA)


def mlas_logistic(x: Tensor) -> Tensor:
    """1 / (1 + exp(-x)) as ``MlasComputeLogisticF32KernelFma3`` computes it (float32)."""
    x = _as_float32(x).clamp(-LOGISTIC_RANGE, LOGISTIC_RANGE)
    return (_odd_rational(x, LOGISTIC_ALPHA, LOGISTIC_BETA) + 0.5).clamp_min(0.0)


def mlas_exp(x: Tensor) -> Tensor:
    """exp as ``MlasComputeExpF32KernelAvx512F`` computes it (float32; module doc)."""
    return _exp_steps(torch.maximum(_as_float32(x), EXP_LOWER), EXP_POLY)


def _exp_steps(x: Tensor, poly: tuple[Tensor, ...]) -> Tensor:
    """exp of float32 ``x`` by the kernels' steps (module doc) with polynomial p0 .. p4."""
    m = fma_float32(x, EXP_LOG2E, EXP_BIAS) - EXP_BIAS  # exact: an integer-valued float32
    r = fma_float32(m, EXP_LN2_HI, x)
    r = fma_float32(m, EXP_LN2_LO, r)
    p = _horner((*poly, ONE, ONE), r)
    # p * 2**m is exact in float64 (|m| <= 150): one rounding to float32, as vscalefps rounds
    return (p.to(torch.float64) * torch.exp2(m.to(torch.float64))).to(torch.float32)


def _as_float32(x: Tensor) -> Tensor:
    if x.dtype != torch.float32:
        raise TypeError(f"the MLAS kernels take float32 values, got {x.dtype}")
    return x


# the AVX-512F GELU kernel's constants (gelu_avx512f.cpp), each the float32 nearest its decimal;
# its erf's are MlasErfConstants' (erf.cpp) of onnxruntime 1.32
GELU_INV_SQRT2, GELU_HALF, GELU_ERF_CAP, GELU_ERF_SPLIT = _f32(  # 1/sqrt 2, 0.5, 3.925, 0.921875
    "0x1.6a09e6p-1", "0x1p-1", "0x1.f66666p+1", "0x1.d8p-1"
)
# erf below the split: -5.99104969e-4, 4.99339588e-3, -2.67667342e-2, 1.12818025e-1,
# -3.76124859e-1, 1.28379151e-1 (P5 - 1); above: 1.72948930e-5, -3.83208680e-4, 3.88393435e-3,
# -2.42545605e-2, 1.06777847e-1, 6.34846687e-1, 1.28717512e-1 (P6 - 1)
GELU_ERF_SMALL = _f32(
    "-0x1.3a1a82p-11", "0x1.473f48p-8", "-0x1.b68bd2p-6", "0x1.ce1a46p-4", "-0x1.8126ep-2",
    "0x1.06eba6p-3",
)  # fmt: skip
GELU_ERF_BIG = _f32(
    "0x1.2229p-16", "-0x1.91d2ccp-12", "0x1.fd1336p-9", "-0x1.8d63p-6", "0x1.b55cbp-4",
    "0x1.450aap-1", "0x1.079d0cp-3",
)  # fmt: skip
(GELU_EXP_LOWER,) = _f32("-0x1.61814ap+6")  # -88.3762626647949
# exp: 1.38319808e-3, 8.37550033e-3, 4.16689515e-2, 1.66664466e-1, 4.99999851e-1, then 1, 1
GELU_EXP_POLY = _f32(
    "0x1.6a98dap-10", "0x1.1272cap-7", "0x1.555a2p-5", "0x1.55542ep-3", "0x1.fffff6p-2"
)


def _gelu_erf(v: Tensor) -> Tensor:
    a = torch.minimum(v.abs(), GELU_ERF_CAP)
    small = fma_float32(_horner(GELU_ERF_SMALL, a * a), a, a)
    split = a > GELU_ERF_SPLIT
    b_in = torch.where(split, a, torch.zeros_like(a))
    big = fma_float32(_horner(GELU_ERF_BIG, b_in), b_in, b_in)
    big = torch.maximum(GELU_EXP_LOWER, -big)
    big = ONE - _exp_steps(big, GELU_EXP_POLY)
    mag = torch.where(split, big, small)
    return torch.where(torch.signbit(v), -mag, mag)


def mlas_gelu(x: Tensor) -> Tensor:
    """GELU (erf form) as ``MlasGeluErfKernelAvx512F`` computes it (float32; module doc)."""
    x = _as_float32(x)
    e = _gelu_erf(x * GELU_INV_SQRT2)
    return (GELU_HALF * x) * (e + ONE)


def mlas_erf(x: Tensor) -> Tensor:
    """erf as onnxruntime's ``MlasComputeErf`` computes it (float32; module doc)."""
    return _gelu_erf(_as_float32(x))
