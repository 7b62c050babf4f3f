"""Sparse autoencoders: train (SAELens modules and trainer), load, describe features, map interference, intervene.

Submodules import torch / SAELens lazily, so ``import workbench.sae`` stays light.
"""
