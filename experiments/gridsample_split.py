"""How much precision grid_sample loses as W grows, and how much splitting W into k parts buys.

The J6 grid is the normalised [-1, 1] grid in int16 with the fixed scale (2/W + 1)/32767 per
axis (j6-numerics s.4), so one grid step is about W/65534 pixels; splitting W into k parts, each
with its own grid scale and a halo, divides the step by k. Measured on seeded textures with four
grid kinds (identity, sub-pixel shift, smooth warp, homography), nearest and bilinear,
align_corners both ways, W from 256 to 65536 and the 720x1024 fold; grid variants (int8
normalised, int16 absolute Q(15-F).F); UVDoc's predicted grid on its real page photo; and the
vendor's size limits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm import tqdm

from quantlab.analysis.gridsample import (
    GridKind,
    GridVariant,
    fold_pages,
    make_grid,
    measure_case,
    predicted_step_px,
    smooth_texture,
    unwarp_psnr,
)
from quantlab.config import register_schema
from quantlab.experiment import ExperimentResult, RunContext, experiment
from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import SampleMode, grid_limit_violation, required_halo
from quantlab.report import Plot

FOLD_W = 720 * 1024  # a 720 x 1024 BEV map folded into one W


@dataclass
class GridsampleSplitExp:
    """Schema of ``+exp=gridsample_split``."""

    widths: list[int] = field(default_factory=lambda: [256, 1024, 4096, 16384, 65536])
    fold: bool = True  # also W = 720*1024 (the fold used by BEV models)
    splits: list[int] = field(default_factory=lambda: [1, 2, 4, 8, 16])
    height: int = 8  # input H of the texture cases
    kinds: list[GridKind] = field(default_factory=lambda: list(GridKind))
    modes: list[SampleMode] = field(default_factory=lambda: list(SampleMode))
    align_corners: list[bool] = field(default_factory=lambda: [False, True])
    variants: list[GridVariant] = field(default_factory=lambda: list(GridVariant))
    variant_kind: GridKind = GridKind.SMOOTH_WARP  # variants compared on this kind (if run)
    out_h: int = 16  # grid points per case: out_h x out_w, spread over the whole input
    out_w: int = 256
    texture_px: float = 8.0  # feature size of the seeded texture (pixels)
    input_dtype: DType = DType.INT8
    weight_frac_bits: int | None = None  # kernel position bits; None: the platform's (assumed)
    law_min_part_w: int = 256  # the W/(65534 k) law is checked where W/k >= this
    subpixel_w: int = 16384  # the width where splitting must restore sub-pixel accuracy
    subpixel_ref_w: int = 1024  # ... the accuracy of an unsplit grid this wide (vendor max W)
    uvdoc: bool = True
    uvdoc_folds: list[int] = field(default_factory=lambda: [1, 4, 16])  # pages side by side
    uvdoc_splits: list[int] = field(default_factory=lambda: [1, 4, 16])
    uvdoc_rows: int = 64  # output rows computed per unwarp (evenly spaced)
    limit_shapes: list[list[int]] = field(
        default_factory=lambda: [[720, 1024], [1024, 1024], [64, 2048], [1, 16384], [1, FOLD_W]]
    )

    def __post_init__(self) -> None:
        for name in ("widths", "splits", "kinds", "modes", "align_corners", "variants"):
            if not list(getattr(self, name)):
                raise ValueError(f"exp.{name} must not be empty")
        widths = list(self.widths) + ([FOLD_W] if self.fold else [])
        for name, ws, ks in (("splits", widths, self.splits),):
            for w in ws:
                bad = [k for k in ks if k < 1 or w % k]
                if bad:
                    raise ValueError(
                        f"exp.{name}: split counts {bad} do not divide W={w}; every split count "
                        "must be a positive divisor of every width"
                    )
        if self.uvdoc and (min(self.uvdoc_splits) < 1 or min(self.uvdoc_folds) < 1):
            raise ValueError("exp.uvdoc_splits and exp.uvdoc_folds must be positive integers")
        if self.input_dtype not in (DType.INT8, DType.INT16):
            raise ValueError(f"exp.input_dtype must be INT8 or INT16, got {self.input_dtype.name}")
        if self.weight_frac_bits is not None and not 0 <= self.weight_frac_bits <= 15:
            raise ValueError(
                f"exp.weight_frac_bits must be in [0, 15], got {self.weight_frac_bits}"
            )
        for shape in self.limit_shapes:
            if len(shape) != 2 or min(shape) < 1:
                raise ValueError(f"exp.limit_shapes entries must be [H, W] >= 1, got {shape}")


register_schema("exp", "gridsample_split_schema", GridsampleSplitExp)


def _variant_kind(exp: GridsampleSplitExp) -> GridKind:
    """The grid kind the variants, PSNR table and plots use: ``variant_kind`` if it is run,
    else the first kind run."""
    return exp.variant_kind if exp.variant_kind in exp.kinds else exp.kinds[0]


def _variant_align(exp: GridsampleSplitExp) -> bool:
    """align_corners of the variant comparison: False if it is run, else True."""
    return False if False in exp.align_corners else True


def _texture_rows(
    exp: GridsampleSplitExp, gen: torch.Generator, wbits: int, progress: bool
) -> list[dict]:
    widths = list(exp.widths) + ([FOLD_W] if exp.fold else [])
    jobs = []
    for w in widths:
        for kind in exp.kinds:
            for align in exp.align_corners:
                compare = kind is _variant_kind(exp) and align == _variant_align(exp)
                variants = exp.variants if compare else [GridVariant.INT16_NORMALIZED]
                variants = [v for v in variants if v in exp.variants]
                for mode in exp.modes:
                    for k in exp.splits:
                        for v in variants:
                            jobs.append((w, kind, align, mode, k, v))
    rows, cache = [], {}
    for w, kind, align, mode, k, v in tqdm(
        jobs, desc="gridsample_split cases", disable=not progress
    ):
        if ("x", w) not in cache:
            cache.clear()
            cache[("x", w)] = smooth_texture(exp.height, w, exp.texture_px, exp.input_dtype, gen)
        if (kind, align) not in cache:
            cache[(kind, align)] = make_grid(kind, exp.height, w, exp.out_h, exp.out_w, align, gen)
        x, grid = cache[("x", w)], cache[(kind, align)]
        m = measure_case(x, exp.input_dtype, grid, k, mode, align, v, wbits)
        rows.append(
            {
                "W": w,
                "H": exp.height,
                "k": k,
                "part_w": w // k + (2 * m["halo"] if k > 1 else 0),
                "grid": kind.name,
                "mode": mode.name,
                "align_corners": align,
                "variant": v.name,
                "predicted_px": w / (65534 * k),
                "step_px": predicted_step_px(w, k, v, exp.height, exp.out_h, exp.out_w),
                **m,
            }
        )
    return rows


def _uvdoc_rows(exp: GridsampleSplitExp, wbits: int, progress: bool) -> tuple[list[dict], str]:
    from quantlab.data import load_data
    from quantlab.models import build_model

    bundle = build_model("uvdoc")
    data = load_data("page", model="uvdoc")
    (x,) = data.eval[0]
    photo = data.labels[0]  # (1, 3, H, W) in [0, 1], full resolution
    with torch.no_grad():
        small = bundle.module(x)  # (1, 2, 45, 31), align_corners=True grid
    gray = photo.mean(1, keepdim=True)
    h0, w0 = gray.shape[-2:]
    full = F.interpolate(small, size=(h0, w0), mode="bilinear", align_corners=True)
    full = full.permute(0, 2, 3, 1).contiguous()
    multiple = math.lcm(*exp.uvdoc_splits)
    rows = []
    jobs = [(n, k) for n in exp.uvdoc_folds for k in exp.uvdoc_splits]
    cache: dict = {}
    for n, k in tqdm(jobs, desc="gridsample_split uvdoc", disable=not progress):
        if n not in cache:
            cache.clear()
            cache[n] = fold_pages(gray, full, n, multiple, exp.uvdoc_rows)
        img, grid = cache[n]
        w = img.shape[-1]
        r = unwarp_psnr(
            img,
            grid,
            k,
            GridVariant.INT16_NORMALIZED,
            exp.input_dtype,
            exp.uvdoc_rows,
            wbits,
        )
        rows.append({"pages": n, "W": w, "H": h0, "k": k, "predicted_px": w / (65534 * k), **r})
    desc = f"page photo {w0}x{h0} (grey), UVDoc grid {tuple(small.shape[-2:])}"
    return rows, desc


def _split_to_fit(h: int, w: int, platform) -> int:
    """The smallest split count k dividing W whose parts (with halos) meet the size limits;
    0 when no k does (H alone breaks them)."""
    for k in range(1, w + 1):
        if w % k:
            continue
        part = w // k + (2 * required_halo(w // k, DType.INT16) if k > 1 else 0)
        if (
            grid_limit_violation(h, min(part, w), platform.grid_max_side, platform.grid_max_area)
            is None
        ):
            return k
    return 0


def _limit_rows(exp: GridsampleSplitExp, platform) -> list[dict]:
    from quantlab.simulate import Mode, Simulator

    class _Sample(torch.nn.Module):
        def forward(self, x, grid):
            return F.grid_sample(x, grid, align_corners=False)

    rows = []
    for h, w in exp.limit_shapes:
        x = torch.zeros(1, 1, h, w)
        grid = torch.zeros(1, 1, 4, 2)
        try:
            sim = Simulator(_Sample(), platform)
            sim.run(x, grid, mode=Mode.FLOAT)
            op = sim.ops.iloc[0]
            sim_msg = f"accepts ({op['name']}, supported={bool(op['supported'])})"
        except ValueError:
            sim_msg = "rejects (ValueError naming the limit)"
        reason = grid_limit_violation(h, w, platform.grid_max_side, platform.grid_max_area)
        k_needed = _split_to_fit(h, w, platform)
        rows.append(
            {
                "platform": platform.name,
                "H": h,
                "W": w,
                "H*W": h * w,
                "grid_max_side": platform.grid_max_side,
                "grid_max_area": platform.grid_max_area,
                "supported": reason is None,
                "reason": reason or "",
                "k_to_fit": k_needed,
                "simulator": sim_msg,
            }
        )
    return rows


def _law_findings(df: pd.DataFrame, exp: GridsampleSplitExp) -> tuple[list[str], pd.DataFrame]:
    n16 = df[df.variant == GridVariant.INT16_NORMALIZED.name]
    law = n16.groupby(["W", "k"], as_index=False).agg(
        max_px=("coord_err_max_px", "max"),
        mean_px=("coord_err_mean_px", "mean"),
        kernel_max_px=("kernel_err_max_px", "max"),
        predicted_px=("predicted_px", "first"),
    )
    law["ratio_max"] = law.max_px / law.predicted_px
    law["ratio_mean"] = law.mean_px / law.predicted_px
    big = law[law.W / law.k >= exp.law_min_part_w]
    out = [
        f"Coordinate error follows W/(65534 k): over {len(big)} (W, k) pairs with W/k >= "
        f"{exp.law_min_part_w}, the int16 normalised grid's max error is "
        f"{big.ratio_max.min():.3f}-{big.ratio_max.max():.3f} x W/(65534 k) and its mean "
        f"{big.ratio_mean.min():.3f}-{big.ratio_mean.max():.3f} x (half a step and a quarter "
        "step, as uniform rounding predicts)."
    ]
    sub = law[(law.W == exp.subpixel_w)]
    ref = law[(law.W == exp.subpixel_ref_w) & (law.k == 1)]
    if len(sub) and len(ref) and 1 in set(sub.k):
        k_max = int(sub.k.max())
        e1 = float(sub[sub.k == 1].max_px.iloc[0])
        ek = float(sub[sub.k == k_max].max_px.iloc[0])
        er = float(ref.max_px.iloc[0])
        out.append(
            f"At W={exp.subpixel_w} the unsplit grid is off by up to {e1:.4f} px; k={k_max} "
            f"parts bring it to {ek:.4f} px ({e1 / ek:.1f}x better), "
            f"{'within' if ek <= 1.05 * er else 'above'} the {er:.4f} px of an unsplit "
            f"W={exp.subpixel_ref_w} grid (the vendor's largest supported width)."
        )
    rows = []
    for r in law.itertuples():
        rows += [
            {"W": r.W, "k": r.k, "statistic": "measured max", "px": r.max_px},
            {"W": r.W, "k": r.k, "statistic": "measured mean", "px": r.mean_px},
            {"W": r.W, "k": r.k, "statistic": "W/(65534 k)", "px": r.predicted_px},
        ]
    return out, pd.DataFrame(rows)


def _output_findings(df: pd.DataFrame, exp: GridsampleSplitExp) -> list[str]:
    out = []
    n16 = df[df.variant == GridVariant.INT16_NORMALIZED.name]
    bil = n16[n16["mode"] == SampleMode.BILINEAR.name]
    kmin, kmax = min(exp.splits), max(exp.splits)
    for w in sorted({exp.subpixel_w, FOLD_W if exp.fold else exp.subpixel_w}):
        a, b = bil[(bil.W == w) & (bil.k == kmin)], bil[(bil.W == w) & (bil.k == kmax)]
        if len(a) and len(b) and kmin != kmax:
            out.append(
                f"Bilinear output at W={w}: worst {a.out_err_max_lsb.max():.2f} input LSB, "
                f"PSNR {a.psnr_db.min():.1f} dB unsplit; with k={kmax}: "
                f"{b.out_err_max_lsb.max():.2f} LSB, PSNR {b.psnr_db.min():.1f} dB "
                f"(worst over grid kinds and align_corners)."
            )
    near = n16[(n16["mode"] == SampleMode.NEAREST.name) & (n16.grid == GridKind.SHIFT.name)]
    if len(near):
        parts = []
        for w in sorted(set(near.W)):
            a = near[(near.W == w) & (near.k == kmin)].nearest_changed_share.max()
            b = near[(near.W == w) & (near.k == kmax)].nearest_changed_share.max()
            parts.append(f"W={w}: {100 * a:.1f}% -> {100 * b:.1f}%")
        out.append(
            f"Nearest on the sub-pixel shifted grid, share of points taking a different source "
            f"pixel than float (k={kmin} -> k={kmax}): " + "; ".join(parts) + "."
        )
    var = df[(df.grid == _variant_kind(exp).name) & (df.align_corners == _variant_align(exp))]
    var = var[(var["mode"] == SampleMode.BILINEAR.name) & (var.k == kmin)]
    if var.variant.nunique() > 1:
        parts = []
        for w in (exp.subpixel_ref_w, exp.subpixel_w):
            sel = var[var.W == w]
            if len(sel):
                cells = ", ".join(
                    f"{r.variant} {r.coord_err_max_px:.4g} px" for r in sel.itertuples()
                )
                parts.append(f"W={w}: {cells}")
        if parts:
            out.append("Grid variants, unsplit max coordinate error: " + "; ".join(parts) + ".")
        ab = var[(var.variant == GridVariant.INT16_ABSOLUTE.name) & (var.W > 32767)]
        if len(ab):
            r = ab.sort_values("W").iloc[0]
            out.append(
                f"The absolute int16 format cannot address columns past 32767 x 2^-F px: at "
                f"W={r.W} unsplit its max coordinate error is {r.coord_err_max_px:.0f} px "
                "(saturated codes); the normalised format has no such wall."
            )
    return out


@experiment(GridsampleSplitExp, "gridsample_split")
def gridsample_split(exp: GridsampleSplitExp, ctx: RunContext) -> ExperimentResult:
    gen = torch.Generator().manual_seed(0 if ctx.seed is None else ctx.seed)
    wbits = exp.weight_frac_bits
    if wbits is None:
        wbits = ctx.platform.grid_weight_frac_bits
    df = pd.DataFrame(_texture_rows(exp, gen, wbits, ctx.progress))
    uv, uv_desc = _uvdoc_rows(exp, wbits, ctx.progress) if exp.uvdoc else ([], "")
    limits = pd.DataFrame(_limit_rows(exp, ctx.platform))
    findings, law = _law_findings(df, exp)
    findings += _output_findings(df, exp)
    tables = {"coordinate_law": law, "size_limits": limits}
    plots = [
        Plot(
            "coordinate_law",
            "W",
            "px",
            "input width W (pixels)",
            "coordinate error (pixels)",
            "int16 normalised grid: measured vs W/(65534 k)",
            hue="statistic",
            facet="k",
            logx=True,
            logy=True,
            table="coordinate_law",
        ),
        Plot(
            "psnr_vs_width",
            "W",
            "psnr_db",
            "input width W (pixels)",
            "PSNR vs float (dB)",
            f"int16 normalised grid, {_variant_kind(exp).name}, "
            f"align_corners={_variant_align(exp)}",
            hue="k",
            facet="mode",
            logx=True,
            table="psnr",
        ),
        Plot(
            "variants",
            "W",
            "coord_err_max_px",
            "input width W (pixels)",
            "max coordinate error (pixels)",
            f"grid variants on the {_variant_kind(exp).name} grid",
            hue="variant",
            facet="k",
            logx=True,
            logy=True,
            table="variants",
        ),
    ]
    sel = (
        (df.variant == GridVariant.INT16_NORMALIZED.name)
        & (df.grid == _variant_kind(exp).name)
        & (df.align_corners == _variant_align(exp))
    )
    tables["psnr"] = df[sel][["W", "k", "mode", "psnr_db", "out_err_max_lsb", "out_err_mean_lsb"]]
    vsel = (df.grid == _variant_kind(exp).name) & (df.align_corners == _variant_align(exp))
    vsel &= df["mode"] == SampleMode.BILINEAR.name
    tables["variants"] = df[vsel][
        ["W", "k", "variant", "step_px", "coord_err_max_px", "out_err_max_lsb", "psnr_db"]
    ]
    if uv:
        uvd = pd.DataFrame(uv)
        tables["uvdoc_unwarp"] = uvd
        plots.append(
            Plot(
                "uvdoc_psnr",
                "W",
                "psnr_db",
                "folded width W (pixels)",
                "PSNR vs float unwarp (dB)",
                "UVDoc's grid on its page photo, pages folded in W",
                hue="k",
                logx=True,
                table="uvdoc_unwarp",
            )
        )
        parts = []
        for n in sorted(set(uvd.pages)):
            s = uvd[uvd.pages == n].sort_values("k")
            parts.append(
                f"{n} page(s), W={int(s.W.iloc[0])}: "
                + ", ".join(f"k={r.k} {r.psnr_db:.1f} dB" for r in s.itertuples())
            )
        findings.append(f"UVDoc unwarp ({uv_desc}), PSNR vs float: " + "; ".join(parts) + ".")
    bad = limits[~limits.supported]
    findings.append(
        f"{ctx.platform.name} size limits (H, W <= {ctx.platform.grid_max_side or 'any'}, "
        f"H*W <= {ctx.platform.grid_max_area or 'any'}): {len(bad)} of {len(limits)} listed "
        "shapes are rejected"
        + (
            "; " + ", ".join(f"{r.H}x{r.W} needs k={r.k_to_fit}" for r in bad.itertuples())
            if len(bad)
            else ""
        )
        + "."
    )
    notes = [
        "Grid: the float grid is quantized per axis with the fixed scale (2/W + 1)/qmax "
        "((2/(W-1) + 1)/qmax with align_corners), half-to-even; the kernel turns each code into "
        f"a pixel position with {wbits} fractional bits (HALF_UP, assumed; "
        "platform.grid_weight_frac_bits), "
        "bilinear weights (2^P - f, f), int64 accumulation, one HALF_UP rounding to the "
        "input's codes (assumed). Absolute variant: Q(15-F).F with F = clamp(15 - "
        "ceil(log2(D + 1)), 0, 8), D the largest side of input part and output grid.",
        "Split: W is cut into k equal parts; each reads its core plus a halo of 1 + "
        "ceil(max position error) columns on inner sides, gets a grid re-normalised to its own "
        "width (its own scale), and each point takes the part that holds its float source x. "
        "A split count must divide W (else ValueError); a NaN grid raises ValueError.",
        "Coordinate error: the x position the integer grid codes denote minus the float "
        "position (x is the wide axis); kernel error adds the P-bit position rounding. Output "
        "error: fixed codes minus float grid_sample of the same integer input, in input LSB; "
        "PSNR with peak qmax - qmin.",
        f"Texture: seeded noise with {exp.texture_px:g}-pixel features, {exp.input_dtype.name} "
        f"codes, H={exp.height}; {exp.out_h}x{exp.out_w} grid points spread over the whole "
        "width. UVDoc: the float model's grid, upsampled to the page size (bilinear, "
        "align_corners=True) as py-reform does, applied to the grey page at its own size; "
        "n copies are folded side by side into one W (each padded to a multiple of every "
        "split count), as BEV models fold maps into W; PSNR (peak 1) over evenly spaced "
        "output rows, against float grid_sample of the same int8 page.",
    ]
    return ExperimentResult(
        table=df,
        title="grid_sample on a large W: precision loss and what splitting W buys back",
        findings=findings,
        tables=tables,
        plots=plots,
        notes=notes,
    )
