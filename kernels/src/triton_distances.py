"""Triton kernel for squared Euclidean distances from centered inputs.

Importing this module does not import triton: the kernel is built on first use, so the
package works where triton is absent. Triton reads ``TRITON_INTERPRET`` when a function is
decorated with ``@triton.jit``, and ``triton.language`` decorates its own helpers when it
is imported, so ``TRITON_INTERPRET=1`` must be set before triton is first imported in the
process (tests run the kernel in a subprocess for that reason); it then runs on CPU tensors.

The kernel takes inputs already centered (see ``workbench.kernels.distances``) and their squared
norms, and computes ``max(|x|^2 + |y|^2 - 2 x.y, 0)`` tile by tile with an fp32 (IEEE, not
TF32) accumulator. For self-distances only the upper triangle of tiles is computed and
mirrored, diagonal tiles are averaged with their transpose, and the diagonal is set to 0,
so the result is exactly symmetric with an exact zero diagonal.
"""

from __future__ import annotations

import os
from functools import cache

BLOCK_M = 64
BLOCK_N = 64
BLOCK_K = 32


def interpret_mode() -> bool:
    """Whether triton will run kernels in its CPU interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def is_available() -> bool:
    """Whether triton can be imported at all."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def _build_kernel(interpret: bool):
    """Decorate the kernel; ``interpret`` is only the cache key (triton reads the env var)."""
    import triton
    import triton.language as tl

    @triton.jit
    def sqdist_kernel(
        x_ptr, y_ptr, xx_ptr, yy_ptr, d_ptr,
        M, N, K,
        stride_xm, stride_xk, stride_ym, stride_yk, stride_dm, stride_dn,
        SYMMETRIC: tl.constexpr, SQRT: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
    ):  # fmt: skip
        pid_m = tl.program_id(0)
        pid_n = tl.program_id(1)
        # Lower-triangle tiles of a self-distance matrix are written by their mirror tile.
        if (not SYMMETRIC) or pid_n >= pid_m:
            rm = pid_m * BM + tl.arange(0, BM)
            rn = pid_n * BN + tl.arange(0, BN)
            rk = tl.arange(0, BK)
            # 64-bit offsets: row * stride overflows int32 once n * n (or n * d) > 2**31
            om = rm.to(tl.int64)
            on = rn.to(tl.int64)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):
                ks = k0 + rk
                a = tl.load(
                    x_ptr + om[:, None] * stride_xm + ks[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (ks[None, :] < K),
                    other=0.0,
                )
                b = tl.load(
                    y_ptr + on[None, :] * stride_ym + ks[:, None] * stride_yk,
                    mask=(rn[None, :] < N) & (ks[:, None] < K),
                    other=0.0,
                )
                acc += tl.dot(a, b, input_precision="ieee")
            xx = tl.load(xx_ptr + rm, mask=rm < M, other=0.0)
            yy = tl.load(yy_ptr + rn, mask=rn < N, other=0.0)
            d = xx[:, None] + yy[None, :] - 2.0 * acc
            d = tl.maximum(d, 0.0)
            if SYMMETRIC:
                if pid_m == pid_n:
                    d = (d + tl.trans(d)) * 0.5
                d = tl.where(rm[:, None] == rn[None, :], 0.0, d)
            if SQRT:
                d = tl.sqrt(d)
            mask = (rm[:, None] < M) & (rn[None, :] < N)
            tl.store(d_ptr + om[:, None] * stride_dm + on[None, :] * stride_dn, d, mask=mask)
            if SYMMETRIC and pid_n > pid_m:
                tl.store(d_ptr + on[None, :] * stride_dm + om[:, None] * stride_dn, d, mask=mask)

    return sqdist_kernel


def sqdist(xc, yc, xx, yy, out=None, symmetric: bool = False, sqrt: bool = False):
    """Distances between rows of centered float32 tensors ``xc`` (M, K) and ``yc`` (N, K).

    ``xx``/``yy`` are the squared row norms. ``symmetric=True`` means ``yc is xc`` (self
    distances). ``sqrt`` returns Euclidean instead of squared distances.
    """
    import torch
    import triton

    kernel = _build_kernel(interpret_mode())
    m, k = xc.shape
    n = yc.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.float32, device=xc.device)
    grid = (triton.cdiv(m, BLOCK_M), triton.cdiv(n, BLOCK_N))
    kernel[grid](
        xc, yc, xx, yy, out,
        m, n, k,
        xc.stride(0), xc.stride(1), yc.stride(0), yc.stride(1), out.stride(0), out.stride(1),
        SYMMETRIC=symmetric, SQRT=sqrt, BM=BLOCK_M, BN=BLOCK_N, BK=BLOCK_K,
    )  # fmt: skip
    return out


def compile_for(arch: int = 90, symmetric: bool = True):
    """Compile the kernel ahead of time for an NVIDIA arch (90 = H100/H200), no GPU needed.

    Lets CI machines without a GPU check that the kernel lowers to PTX and a cubin (triton
    ships ptxas); returns triton's compiled kernel (``.asm["ptx"]``, ``.asm["cubin"]``).
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel = _build_kernel(False)
    constexprs = {"SYMMETRIC": symmetric, "SQRT": False, "BM": BLOCK_M, "BN": BLOCK_N, "BK": BLOCK_K}
    signature = {}
    for name in kernel.arg_names:
        if name in constexprs:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*fp32"
        else:
            signature[name] = "i32"
    source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32))
