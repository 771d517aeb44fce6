"""What the machine running the tests has besides Python."""

from quantlab.numerics.native import compiler

# the C compiler quantlab's native kernels (the LUT gather, the norm composite) are built with
CC = compiler()
