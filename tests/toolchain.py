"""What the machine running the tests has besides Python."""

from quantlab.numerics.lut.gather import _compiler

# the C compiler the LUT gather's compiled kernel is built with, or None
CC = _compiler()
