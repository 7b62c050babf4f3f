"""Worker processes for the independent pieces of one analysis: the probe's layers, the detector's candidate layers.

Spawned, not forked: the parent holds torch's OpenMP threads, which a fork would copy in an unknown state. Each
worker keeps one BLAS thread, so n workers on n cores do not oversubscribe them. Starting a pool costs about 2 s
(a fresh interpreter importing numpy and scikit-learn), so callers use one only for work that repays it. On an
error or Ctrl-C the queued pieces are dropped; whatever the caller already saved per piece stays.
"""

from __future__ import annotations

import contextlib
import os


def n_workers(n_jobs: int | None, n_tasks: int) -> int:
    """Workers for ``n_tasks`` pieces: ``n_jobs`` (default: one per core), never more than there are pieces."""
    return max(1, min(n_jobs or os.cpu_count() or 1, n_tasks))


@contextlib.contextmanager
def process_pool(workers: int, initializer=None, initargs: tuple = ()):
    """A ``ProcessPoolExecutor`` of ``workers`` spawned processes with one BLAS thread each; None for one worker
    (the caller then runs its pieces in this process). ``initializer(*initargs)`` runs once per worker: data every
    piece reads is sent once per worker, not once per piece."""
    if workers <= 1:
        yield None
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start,
                             initargs=(initializer, initargs)) as pool:
        try:
            yield pool
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise


def _start(initializer, initargs: tuple) -> None:
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)
    if initializer is not None:
        initializer(*initargs)
