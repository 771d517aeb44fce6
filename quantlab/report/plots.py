"""Plots drawn from a tidy table by one shared function (experiments never plot by hand)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402


class PlotKind(enum.Enum):
    LINE = "line"
    SCATTER = "scatter"
    BAR = "bar"  # horizontal bars: y is the value, x the category (ranked top to bottom)
    SEQUENCE = (
        "sequence"  # one mark per row at x (a position), on a row per y category, hue colours
    )


@dataclass(frozen=True)
class Plot:
    """One figure made from a table: a panel per ``facet`` value, a series per ``hue`` value.

    ``xlabel``/``ylabel`` must carry units (e.g. "W (pixels)", "max error (output LSB)").
    ``table`` names an extra table of the result (default: the main results table).
    ``vlines`` names a column of that table holding x positions to mark with dotted lines,
    drawn per facet and hue (e.g. a LUT's dividing points).
    ``reference`` names a column plotted as a dashed black line (e.g. a predicted law).
    ``ci_low``/``ci_high`` name columns holding each point's confidence interval, drawn as error
    bars (non-finite ends are left out).
    SEQUENCE draws one square per row at ``x`` on the row of its ``y`` category (``categories``
    gives their order), coloured by ``hue``: e.g. a model's ops in execution order by unit.
    """

    name: str
    x: str
    y: str
    xlabel: str
    ylabel: str
    title: str = ""
    hue: str | None = None
    facet: str | None = None
    kind: PlotKind = PlotKind.LINE
    logx: bool = False
    logy: bool = False
    table: str | None = None
    vlines: str | None = None
    reference: str | None = None
    ci_low: str | None = None
    ci_high: str | None = None
    max_facets: int = 12
    categories: tuple[str, ...] = ()  # SEQUENCE: the y rows in this order (default: first seen)


BAR_INCHES = 0.16  # height of one horizontal bar and its label (7 pt)


def draw(plot: Plot, df: pd.DataFrame):
    """Return a matplotlib Figure for ``plot`` drawn from ``df``."""
    for col in (
        plot.x,
        plot.y,
        plot.hue,
        plot.facet,
        plot.vlines,
        plot.reference,
        plot.ci_low,
        plot.ci_high,
    ):
        if col is not None and col not in df.columns:
            raise KeyError(
                f"plot {plot.name!r}: column {col!r} not in table columns {list(df.columns)}"
            )
    facets = [None] if plot.facet is None else list(dict.fromkeys(df[plot.facet]))
    facets = facets[: plot.max_facets]
    n = len(facets)
    ncol = min(n, 3)
    nrow = (n + ncol - 1) // ncol
    height = 3.8
    if plot.kind is PlotKind.BAR:  # a readable line per bar: the tallest panel sets the rows
        most = max(len(df) if fv is None else int((df[plot.facet] == fv).sum()) for fv in facets)
        height = max(height, BAR_INCHES * most + 1.2)
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, height * nrow), squeeze=False)
    for ax, fv in zip(axes.flat, facets, strict=False):
        sub = df if fv is None else df[df[plot.facet] == fv]
        _draw_panel(ax, plot, sub)
        ax.set_title(f"{plot.facet} = {fv}" if fv is not None else plot.title, fontsize=10)
        if plot.kind is PlotKind.BAR:  # horizontal bars: the value runs along x
            ax.set_xlabel(plot.ylabel)
            ax.set_ylabel(plot.xlabel)
        else:
            ax.set_xlabel(plot.xlabel)
            ax.set_ylabel(plot.ylabel)
        if plot.logx and _any_positive(sub[plot.x]):  # a log axis needs a value above 0
            ax.set_xscale("log")
        if plot.logy and _any_positive(sub[plot.y]):
            ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    top = 1.0
    if plot.title and plot.facet is not None:
        fig.suptitle(plot.title)
        top = 1.0 - 0.45 / fig.get_figheight()  # the suptitle's line stays clear of the panels
    fig.tight_layout(rect=(0.0, 0.0, 1.0, top))
    return fig


def _any_positive(values: pd.Series) -> bool:
    v = pd.to_numeric(values, errors="coerce")
    return bool(((v > 0) & np.isfinite(v)).any())


def _draw_panel(ax, plot: Plot, sub: pd.DataFrame) -> None:
    groups = [(None, sub)] if plot.hue is None else list(sub.groupby(plot.hue, sort=False))
    if plot.kind is PlotKind.SEQUENCE:
        _draw_sequence(ax, plot, sub)
        return
    if plot.kind is PlotKind.BAR:
        labels = sub[plot.x].astype(str).tolist()
        err = _errors(plot, sub)
        ax.barh(range(len(labels)), sub[plot.y].to_numpy(), color="tab:blue", xerr=err)
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.invert_yaxis()
        return
    for key, g in groups:
        g = g.sort_values(plot.x) if plot.kind is PlotKind.LINE else g
        label = None if key is None else str(key)
        if plot.kind is PlotKind.LINE:
            (line,) = ax.plot(
                g[plot.x], g[plot.y], marker="." if len(g) < 40 else None, label=label
            )
        else:
            line = ax.scatter(g[plot.x], g[plot.y], s=14, label=label)
        err = _errors(plot, g)
        if err is not None:
            color = line.get_color() if hasattr(line, "get_color") else line.get_facecolor()[0]
            ax.errorbar(g[plot.x], g[plot.y], yerr=err, fmt="none", ecolor=color, capsize=3)
        if plot.vlines is not None:
            color = line.get_color() if hasattr(line, "get_color") else None
            for xv in pd.unique(g[plot.vlines].dropna()):
                ax.axvline(float(xv), color=color, ls=":", lw=0.8, alpha=0.7)
    if plot.reference is not None:
        r = sub[[plot.x, plot.reference]].dropna().drop_duplicates().sort_values(plot.x)
        ax.plot(r[plot.x], r[plot.reference], "k--", lw=1, label=plot.reference)
    if plot.hue is not None or plot.reference is not None:
        ax.legend(fontsize=7, title=plot.hue, title_fontsize=7)


def _draw_sequence(ax, plot: Plot, sub: pd.DataFrame) -> None:
    """Categorical rows (``y``: ``categories`` first, then others as first seen) with one square per
    table row at its ``x`` position, coloured by ``hue`` (default: ``y``)."""
    seen = list(dict.fromkeys(sub[plot.y].astype(str)))
    rows = list(plot.categories) + [v for v in seen if v not in plot.categories]
    hue = plot.hue or plot.y
    cmap = plt.get_cmap("tab10")
    for i, (key, g) in enumerate(sub.groupby(hue, sort=False)):
        ys = [rows.index(v) for v in g[plot.y].astype(str)]
        c = rows.index(str(key)) if hue == plot.y else i  # a category keeps its colour
        ax.scatter(g[plot.x], ys, marker="s", s=18, color=cmap(c % 10), label=str(key))
    ax.set_yticks(range(len(rows)), rows, fontsize=8)
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.invert_yaxis()
    ax.legend(fontsize=7, title=hue, title_fontsize=7, loc="best")


def _errors(plot: Plot, g: pd.DataFrame):
    """(2, n) error-bar lengths below and above each point from the CI columns (None if unset);
    non-finite ends give 0 (no bar on that side)."""
    if plot.ci_low is None or plot.ci_high is None:
        return None

    y = g[plot.y].to_numpy(dtype=float)
    lo = y - g[plot.ci_low].to_numpy(dtype=float)
    hi = g[plot.ci_high].to_numpy(dtype=float) - y
    both = np.stack([lo, hi])
    return np.where(np.isfinite(both) & (both >= 0), both, 0.0)
