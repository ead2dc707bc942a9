"""flash_step._torch: the torch path, imported only when a torch tensor comes (torch is never needed to
install or import the package). Two custom ops over the C interface, flash_step::attention_forward
(O and LSE) and flash_step::attention_backward (dQ, dK, dV), joined by torch.library's register_autograd:
the forward saves Q, K, V, O and the LSE, the backward passes them to fs_backward. CUDA tensors go to the
GPU stages (bf16, fp16; fp32 on step 3), CPU tensors to the CPU stages (fp32, fp64)."""
from typing import Optional, Tuple

import torch

from . import _lib

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"flash_step's torch path needs torch.library.custom_op (torch >= 2.4); this is torch "
                      f"{torch.__version__}")

_DTYPES = {torch.float32: _lib.FP32, torch.float64: _lib.FP64, torch.float16: _lib.FP16, torch.bfloat16: _lib.BF16}


def _code(t, name):
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name} is {t.dtype}: flash_step takes float32, float64 (CPU), bfloat16, float16 (CUDA)")
    return _DTYPES[t.dtype]


def _view(t):
    return _lib.tensor(t.data_ptr(), t.shape, t.stride())


def _lse_dtype(t):
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _options(q, causal, scale, stage, variant):
    memory = _lib.DEVICE if q.is_cuda else _lib.HOST
    return _lib.options(_code(q, "q"), memory, causal, scale if scale else None, stage, variant)


class _on_device:
    """For a CUDA tensor: its device current, and the work already queued on its stream finished (the
    library copies on the legacy default stream and returns when its outputs are complete)."""

    def __init__(self, t):
        self.t = t
        self.guard = torch.cuda.device(t.device) if t.is_cuda else None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()
            torch.cuda.current_stream(self.t.device).synchronize()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)


def _same_kind(tensors, names):
    for t, n in zip(tensors, names):
        if t.device != tensors[0].device:
            raise ValueError(f"{n} is on {t.device}, {names[0]} on {tensors[0].device}")
        if t.dtype != tensors[0].dtype:
            raise TypeError(f"{n} is {t.dtype}, {names[0]} {tensors[0].dtype}: give them one dtype")
        if t.dim() != 4:
            raise ValueError(f"{n} has shape {tuple(t.shape)}: attention takes [B, N, H, d]")


@torch.library.custom_op("flash_step::attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float,
                      stage: Optional[str], variant: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor]:
    _same_kind([q, k, v], ["q", "k", "v"])
    B, Nq, Hq, d = q.shape
    o = torch.empty((B, Nq, Hq, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((B, Hq, Nq), dtype=_lse_dtype(q), device=q.device)
    with _on_device(q):
        _lib.forward(_options(q, causal, scale, stage, variant), _view(q), _view(k), _view(v), _view(o), _view(lse))
    return o, lse


@attention_forward.register_fake
def _(q, k, v, causal, scale, stage, variant):
    B, Nq, Hq, d = q.shape
    return q.new_empty((B, Nq, Hq, d)), q.new_empty((B, Hq, Nq), dtype=_lse_dtype(q))


@torch.library.custom_op("flash_step::attention_backward", mutates_args=())
def attention_backward(dout: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
                       lse: torch.Tensor, causal: bool, scale: float, stage: Optional[str],
                       variant: Optional[str]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    _same_kind([q, k, v, o, dout], ["q", "k", "v", "o", "dout"])
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    with _on_device(q):
        _lib.backward(_options(q, causal, scale, stage, variant), _view(q), _view(k), _view(v), _view(o),
                      _view(lse), _view(dout), _view(dq), _view(dk), _view(dv))
    return dq, dk, dv


@attention_backward.register_fake
def _(dout, q, k, v, o, lse, causal, scale, stage, variant):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, stage, variant = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.args = (causal, scale, stage, variant)
    ctx.mark_non_differentiable(lse)  # the LSE is returned for inspection: no gradient flows through it


def _backward(ctx, dout, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(dout, q, k, v, o, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None


attention_forward.register_autograd(_backward, setup_context=_setup_context)


def attention(q, k, v, causal=False, scale=None, stage=None, variant=None, return_lse=False):
    o, lse = attention_forward(q, k, v, bool(causal), float(scale or 0.0), stage, variant)
    return (o, lse) if return_lse else o


def resolve(q, k, causal=False, scale=None, stage=None, variant=None, backward=False):
    return _lib.resolve(_options(q, causal, scale, stage, variant), _view(q), _view(k), backward)
