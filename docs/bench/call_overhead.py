"""FlashAttention, step by step — docs/bench/call_overhead.py: the host's cost of one attention call at the tiny
GPT's shape (python/examples/tiny_gpt: B = 16, N = 256, H = 4, d = 64, bf16, causal), where the kernels take
microseconds and a training step is bound by the host. Per call, after a warm-up, the mean over 300 calls: the
host's time (the loop alone) and with the GPU (after a synchronize). Rows: SDPA; the torch op (flash_step.attention);
the C interface through ctypes (fs_forward, fs_backward, fs_resolve: what the op pays under torch's machinery);
forward and backward through autograd, both.

    PYTHONPATH=python FLASH_STEP_LIBRARY=build/libflash_step.so python3 docs/bench/call_overhead.py
"""
import time

import torch
import torch.nn.functional as F

import flash_step
from flash_step import _lib, _torch

B, N, H, d = 16, 256, 4, 64


def per_call(f, n=300):
    for _ in range(20):
        f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        f()
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return f"host {host:7.1f} us/call, with the GPU {(time.perf_counter() - t) / n * 1e6:7.1f}"


def main():
    make = lambda: (torch.randn(B, N, H, d, device="cuda") + 0.5).to(torch.bfloat16)  # noqa: E731
    q, k, v, do = make(), make(), make(), make()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; B = {B}, N = {N}, H = {H}, d = {d}, bf16, causal")
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    print("SDPA forward             ", per_call(lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)))
    print("flash_step.attention     ", per_call(lambda: flash_step.attention(q, k, v, causal=True)))
    o, lse = torch.empty_like(q), _torch._lse_empty(q, B, H, N)
    opts = _torch._options(q, True, None, None, None)
    fwd = [_torch._view(x) for x in (q, k, v, o, lse)]
    print("fs_forward (ctypes)      ", per_call(lambda: _lib.forward(opts, *fwd)))
    print("fs_resolve (ctypes)      ", per_call(lambda: _lib.resolve(opts, fwd[0], fwd[1], False)))
    grads = [torch.empty_like(x) for x in (q, k, v)]
    bwd = [_torch._view(x) for x in (q, k, v, o, lse, do, *grads)]
    print("fs_backward (ctypes)     ", per_call(lambda: _lib.backward(opts, *bwd)))
    print(f"  (path: fs_last_call_copied() = {flash_step.last_call_copied()}, 0 = in place)")

    def both(attend):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        return lambda: attend(*leaves).backward(do)

    sdpa = lambda a, b, c: F.scaled_dot_product_attention(  # noqa: E731
        a.transpose(1, 2), b.transpose(1, 2), c.transpose(1, 2), is_causal=True).transpose(1, 2)
    print("SDPA forward + backward  ", per_call(both(sdpa)))
    print("flash_step fwd + bwd     ", per_call(both(lambda a, b, c: flash_step.attention(a, b, c, causal=True))))


if __name__ == "__main__":
    main()
