"""What the machine running the tests has besides Python."""

import os
import shutil

# the C++ compiler torch.compile would use (the LUT gather's compiled kernel), or None
CXX = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
