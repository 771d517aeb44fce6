import pytest
import torch

from experiments.gridsample_split import GridsampleSplitExp, gridsample_split
from quantlab.analysis.gridsample import GridKind, GridVariant, measure_case
from quantlab.experiment import RunContext
from quantlab.numerics.dtypes import DType
from quantlab.numerics.grid_sample import SampleMode
from quantlab.platforms import PlatformConfig


def _ctx(tmp_path):
    return RunContext(PlatformConfig(name="j6m"), None, None, 0, tmp_path)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    exp = GridsampleSplitExp(
        widths=[1024, 16384],
        fold=False,
        splits=[1, 4, 16],
        kinds=[GridKind.SMOOTH_WARP, GridKind.SHIFT],
        align_corners=[False],
        out_h=8,
        out_w=256,
        uvdoc=False,
        limit_shapes=[[720, 1024], [1, 2048]],
    )
    return gridsample_split(exp, _ctx(tmp_path_factory.mktemp("gs")))


def test_columns_and_rows(result):
    df = result.table
    for col in (
        "W",
        "k",
        "grid",
        "mode",
        "variant",
        "predicted_px",
        "coord_err_max_px",
        "coord_err_mean_px",
        "out_err_max_lsb",
        "psnr_db",
        "nearest_changed_share",
    ):
        assert col in df.columns
    # 2 widths x (shift: 2 modes x 3 k + smooth warp: 2 modes x 3 k x 3 variants)
    assert len(df) == 2 * (6 + 18)
    assert set(result.tables) >= {"coordinate_law", "size_limits", "psnr", "variants"}
    assert result.findings[0].startswith("Coordinate error follows W/(65534 k)")


def test_coordinate_error_follows_the_law(result):
    df = result.table
    n16 = df[(df.variant == "INT16_NORMALIZED") & (df.W / df.k >= 256)]
    ratio = n16.coord_err_max_px / n16.predicted_px
    assert ratio.between(0.45, 0.56).all(), ratio.describe()
    mean_ratio = n16.coord_err_mean_px / n16.predicted_px
    assert mean_ratio.between(0.2, 0.3).all()


def test_split_restores_subpixel_accuracy_at_16384(result):
    df = result.table
    n16 = df[(df.variant == "INT16_NORMALIZED") & (df["mode"] == "BILINEAR")]
    ref = n16[(n16.W == 1024) & (n16.k == 1)].coord_err_max_px.max()
    unsplit = n16[(n16.W == 16384) & (n16.k == 1)].coord_err_max_px.max()
    split = n16[(n16.W == 16384) & (n16.k == 16)].coord_err_max_px.max()
    assert unsplit > 0.1 and split < 0.01
    assert split <= 1.05 * ref
    psnr1 = n16[(n16.W == 16384) & (n16.k == 1)].psnr_db.min()
    psnr16 = n16[(n16.W == 16384) & (n16.k == 16)].psnr_db.min()
    assert psnr16 > psnr1 + 5


def test_size_limits_table(result):
    lim = result.tables["size_limits"]
    assert list(lim.supported) == [True, False]
    assert lim.k_to_fit.tolist() == [1, 4]
    assert lim.simulator.iloc[1].startswith("rejects")


def test_bad_split_count_and_nan_grid():
    with pytest.raises(ValueError, match=r"split counts \[3\] do not divide W=1024"):
        GridsampleSplitExp(widths=[1024], fold=False, splits=[1, 3])
    x = torch.zeros(1, 1, 4, 64, dtype=torch.int8)
    grid = torch.zeros(1, 2, 2, 2)
    grid[0, 1, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        measure_case(
            x, DType.INT8, grid, 2, SampleMode.BILINEAR, False, GridVariant.INT16_NORMALIZED
        )


def test_uvdoc_fold_runs(tmp_path):
    pytest.importorskip("py_reform")
    exp = GridsampleSplitExp(
        widths=[256],
        fold=False,
        splits=[1],
        kinds=[GridKind.IDENTITY],
        modes=[SampleMode.BILINEAR],
        align_corners=[False],
        variants=[GridVariant.INT16_NORMALIZED],
        out_h=2,
        out_w=16,
        uvdoc_folds=[2],
        uvdoc_splits=[1, 2],
        uvdoc_rows=4,
        limit_shapes=[[1, 8]],
    )
    res = gridsample_split(exp, _ctx(tmp_path))
    uv = res.tables["uvdoc_unwarp"]
    assert list(uv.k) == [1, 2] and (uv.W == 2 * 1068).all()
    assert (uv.psnr_db > 40).all()


@pytest.mark.parametrize("variant", list(GridVariant))
def test_positions_nearest_match_the_kernel(variant):
    from quantlab.analysis.gridsample import fixed_positions, make_grid, smooth_texture
    from quantlab.numerics.grid_sample import split_grid_sample

    gen = torch.Generator().manual_seed(2)
    h, w, k = 6, 512, 4
    x = smooth_texture(h, w, 4, DType.INT8, gen)
    grid = make_grid(GridKind.SMOOTH_WARP, h, w, 4, 64, False, gen)
    pos = fixed_positions(grid, h, w, k, False, variant)
    out = split_grid_sample(
        x,
        1.0,
        DType.INT8,
        grid,
        k,
        None,
        SampleMode.NEAREST,
        coord=variant.coord,
        grid_dtype=variant.dtype,
    )
    iy, ix = pos.nearest_y.clamp(0, h - 1), pos.nearest_x.clamp(0, w - 1)
    inside = (pos.nearest_x >= 0) & (pos.nearest_x < w) & (pos.nearest_y >= 0) & (pos.nearest_y < h)
    expect = torch.where(inside, x[0, 0][iy, ix], torch.zeros((), dtype=x.dtype))
    assert torch.equal(out[0, 0], expect[0])
