"""Model tools (quantization, sparse attention, generation), each a set of hooks on a hooked model.

Submodules import torch; this package file stays light so ``import workbench.tools`` is cheap.
"""
