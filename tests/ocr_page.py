"""Text lines of skimage's page.png for PP-OCRv4's recognizer: the page at twice its size, the
lines the detector finds (float), each cut along its curve, and the strings they hold.

The page is a photographed book page whose lines bend: a straight crop takes parts of the
next line, so each line is resampled along a quadratic through its text map's column centres,
1.6 text-map heights either side (DBNet's map is a shrunk kernel of the text)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from scipy import ndimage

from quantlab.data.images import read_image
from quantlab.models import packages

# the six prose lines of the page, as printed
TRUTH = (
    "Region-based segmentation",
    "Let us first determine markers of the coins and the",
    "background. These markers are pixels that we can label",
    "unambiguously as either object or background. Here,",
    "the markers are found at the two extreme parts of the",
    "histogram of grey values:",
)
HEIGHT = 48  # the recognizer's input height
MIN_LINE = 120  # text-map components narrower than this (pixels at 2x) are not prose lines


def page_2x() -> torch.Tensor:
    """(3, H, W) RGB in [0, 1], twice page.png's size, cut to multiples of 32 (352 x 768)."""
    page = read_image(packages.package_file(packages.SKIMAGE, "data/page.png", "test"))
    page = F.interpolate(page[None], scale_factor=2, mode="bilinear", align_corners=False)[0]
    page = page.clamp(0, 1)
    return page[:, : page.shape[1] // 32 * 32, : page.shape[2] // 32 * 32]


def detector_input(page: torch.Tensor) -> torch.Tensor:
    """The detector's preprocessing: BGR, (x - 0.5) / 0.5, batch of one."""
    return ((page.flip(0) - 0.5) / 0.5)[None]


def line_crops(page: torch.Tensor, text_map: torch.Tensor, width: int) -> torch.Tensor:
    """(lines, 3, 48, width) recognizer inputs (BGR, (x - 0.5) / 0.5, zero-padded on the right)
    of the prose lines in ``text_map`` (H, W) bool, top to bottom."""
    labels, _ = ndimage.label(text_map.numpy())
    h, w = page.shape[-2:]
    bgr = page.flip(0)[None]
    out = []
    for k, (rows, cols) in enumerate(ndimage.find_objects(labels), 1):
        if cols.stop - cols.start < MIN_LINE:
            continue
        mask = labels[rows, cols] == k
        xs = np.nonzero(mask.any(0))[0]
        centres = np.array([np.nonzero(mask[:, c])[0].mean() for c in xs]) + rows.start
        half = 1.6 * float(np.median(mask.sum(0)[xs]))
        curve = np.polyfit(xs + cols.start, centres, 2)
        x0, x1 = max(0, cols.start - int(half)), min(w, cols.stop + int(half))
        n = min(width, round((x1 - x0) * HEIGHT / (2 * half)))
        gx = torch.linspace(x0, x1 - 1, n, dtype=torch.float64)
        gy = torch.from_numpy(np.polyval(curve, gx.numpy()))[None, :]
        gy = gy + torch.linspace(-half, half, HEIGHT, dtype=torch.float64)[:, None]
        grid = torch.stack([(gx.expand(HEIGHT, n) * 2 + 1) / w - 1, (gy * 2 + 1) / h - 1], -1)
        strip = F.grid_sample(bgr, grid[None].float(), mode="bilinear", align_corners=False)[0]
        line = torch.zeros(3, HEIGHT, width)
        line[:, :, :n] = (strip - 0.5) / 0.5
        out.append(line)
    return torch.stack(out)


def ctc_greedy(logits: torch.Tensor, chars: list[str]) -> list[str]:
    """Greedy CTC decoding of (N, T, classes): best class per step, repeats merged, blanks
    (class 0) dropped; class k is ``chars[k - 1]``, the last class a space."""
    out = []
    for row in logits.argmax(-1).tolist():
        text, prev = [], 0
        for k in row:
            if k not in (0, prev):
                text.append(chars[k - 1] if k - 1 < len(chars) else " ")
            prev = k
        out.append("".join(text))
    return out


def char_errors(got: str, want: str) -> int:
    """Edit distance between the two strings with spaces removed (the page's spacing is not
    what is measured)."""
    a, b = got.replace(" ", ""), want.replace(" ", "")
    d = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, cb in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (ca != cb))
    return d[-1]
