"""flash_step: FlashAttention, step by step, from Python.

ctypes over libflash_step.so (capi/flash_step.h): nothing is compiled at install time and nothing is built
against PyTorch. The library is $FLASH_STEP_LIBRARY, else build/libflash_step.so of this checkout.

    attention(q, k, v, causal=False, scale=None, stage=None, variant=None, return_lse=False)
    attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, ...)       # packed batches
    attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=True, ...)

q [B, Nq, Hq, d], k and v [B, Nk, Hkv, d] (Hkv divides Hq), as flash_attn_func; any strides. numpy arrays
(float32, float64) run on the CPU stages; torch tensors run through the custom op flash_step::attention_forward,
with autograd (its backward is the C interface's fs_backward): CUDA tensors on the GPU stages (bfloat16,
float16), CPU tensors on the CPU stages. causal is bottom-right aligned (query i sees key j iff
j <= i + Nk - Nq); scale defaults to 1/sqrt(d); stage and variant name what runs (default: the fastest stage
of the memory kind). docs/interface.md says more.
"""
import sys

from ._lib import FlashStepError, gpu_unavailable_reason, last_call_copied, library_path, stages, version

__all__ = ["attention", "attention_backward", "attention_varlen", "attention_varlen_backward", "attention_with_kvcache", "resolve", "FlashStepError", "version", "stages", "last_call_copied",
           "gpu_unavailable_reason", "library_path"]


def _is_torch(x):
    torch = sys.modules.get("torch")  # a torch tensor means torch is imported already: never import it here
    return torch is not None and isinstance(x, torch.Tensor)


def attention(q, k, v, causal=False, scale=None, stage=None, variant=None, return_lse=False):
    """O [B, Nq, Hq, d] (and the LSE [B, Hq, Nq] with return_lse) of softmax(scale q k^T, masked) v."""
    if _is_torch(q):
        from . import _torch
        return _torch.attention(q, k, v, causal, scale, stage, variant, return_lse)
    from . import _numpy
    return _numpy.attention(q, k, v, causal, scale, stage, variant, return_lse)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, stage=None, variant=None,
                     return_lse=False):
    """A packed variable-length batch, as flash_attn_varlen_func: q [total_q, Hq, d], k and v [total_k, Hkv, d],
    the sequences end to end; cu_seqlens_q/k (batch + 1 offsets from 0) say where each starts. Sequence b sees
    only its own keys (causal: bottom-right in them). Returns O [total_q, Hq, d] (and the LSE [Hq, total_q]).
    The CPU stages run numpy arrays and CPU torch tensors; CUDA torch tensors run on the GPU stages (step 4's
    forward and step 5's backward read the offsets themselves); torch tensors have autograd."""
    if _is_torch(q):
        from . import _torch
        return _torch.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, stage, variant, return_lse)
    from . import _numpy
    return _numpy.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, scale, stage, variant, return_lse)


def attention_varlen_backward(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, stage=None,
                              variant=None):
    """(dQ, dK, dV) of a packed batch (numpy arrays; torch tensors use autograd)."""
    from . import _numpy
    return _numpy.attention_varlen_backward(dout, q, k, v, o, lse, cu_seqlens_q, cu_seqlens_k, causal, scale, stage,
                                            variant)


def attention_with_kvcache(q, k_cache, v_cache, cache_seqlens=None, block_table=None, causal=True, scale=None,
                           stage=None, variant=None, return_lse=False):
    """O [B, Nq, Hq, d] of q against a KV cache, as flash_attn_with_kvcache decodes: sequence b holds
    cache_seqlens[b] keys (None: all), its queries are its last positions (causal: bottom-right in each
    sequence). k_cache, v_cache: [B, Nk, Hkv, d], or with block_table [B, pages per sequence] a pool of pages
    [pages, page_size, Hkv, d]. CUDA tensors: step 4's split-KV kernel; numpy arrays: step 1, the reference.
    No autograd: a decoding step."""
    if _is_torch(q):
        from . import _torch
        return _torch.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, stage,
                                             variant, return_lse)
    from . import _numpy
    return _numpy.attention_with_kvcache(q, k_cache, v_cache, cache_seqlens, block_table, causal, scale, stage,
                                         variant, return_lse)


def attention_backward(dout, q, k, v, o, lse, causal=False, scale=None, stage=None, variant=None):
    """(dQ, dK, dV) from dO and the forward's O and LSE (numpy arrays; torch tensors use autograd)."""
    if _is_torch(q):
        from . import _torch
        return _torch.attention_backward(dout, q, k, v, o, lse, bool(causal), float(scale or 0.0), stage, variant)
    from . import _numpy
    return _numpy.attention_backward(dout, q, k, v, o, lse, causal, scale, stage, variant)


def resolve(q, k, causal=False, scale=None, stage=None, variant=None, backward=False):
    """(stage, variant) that attention (backward=False) or its backward would run on these inputs."""
    if _is_torch(q):
        from . import _torch
        return _torch.resolve(q, k, causal, scale, stage, variant, backward)
    from . import _numpy
    return _numpy.resolve(q, k, causal, scale, stage, variant, backward)
