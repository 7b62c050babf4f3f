"""Plain-tensor kernels, no model code: distances (a Triton kernel on CUDA, a torch path elsewhere, see
``workbench.kernels.distances``) and single-query decode attention (``workbench.kernels.attention``)."""

from .attention import cluster_members, decode_attention, sparse_decode_attention, tactic_decode_attention
from .distances import iter_distance_blocks, knn, maxmin_subsample, pairwise_distances, radius_edges

__all__ = ["cluster_members", "decode_attention", "iter_distance_blocks", "knn", "maxmin_subsample",
           "pairwise_distances", "radius_edges", "sparse_decode_attention", "tactic_decode_attention"]
