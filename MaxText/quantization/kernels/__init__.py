"""Pallas (Triton) kernels for the operand quantizers, and which implementation runs them."""
