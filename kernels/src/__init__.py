"""Distance kernels: a Triton kernel on CUDA, a torch path elsewhere (see ``workbench.kernels.distances``)."""

from .distances import iter_distance_blocks, knn, maxmin_subsample, pairwise_distances, radius_edges

__all__ = ["iter_distance_blocks", "knn", "maxmin_subsample", "pairwise_distances", "radius_edges"]
