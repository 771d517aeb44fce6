"""Data registry: real images and text shipped inside installed packages, plus synthetic inputs.

from quantlab.data import load_data
data = load_data("photos", model="mobilenet_v2")   # data.calib / data.eval: batches for model(*b)
"""

from quantlab.data.dataset import Dataset
from quantlab.data.registry import DATA_NAMES, load_data

__all__ = ["DATA_NAMES", "Dataset", "load_data"]
