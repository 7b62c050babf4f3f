"""Plain-tensor kernels, no model code: distances (a Triton kernel on CUDA, a torch path elsewhere, see
``workbench.kernels.distances``) and single-query decode attention (``workbench.kernels.attention``)."""

from .attention import ClusteredCache, cluster_cache, decode_attention, tactic_decode_attention
from .distances import iter_distance_blocks, knn, maxmin_subsample, pairwise_distances, radius_edges

__all__ = ["ClusteredCache", "cluster_cache", "decode_attention", "iter_distance_blocks", "knn", "maxmin_subsample",
           "pairwise_distances", "radius_edges", "tactic_decode_attention"]
