"""Tests of the torch path: the custom op flash_step::attention_forward and its autograd (the C backward),
against torch's scaled_dot_product_attention. Skipped without torch; the GPU ones also without a CUDA GPU
the GPU stages run on. On a GPU machine with torch (docs/interface.md):
    PYTHONPATH=python FLASH_STEP_LIBRARY=build/libflash_step.so python3 -m unittest discover -s python/tests -v

The rule (core/metrics.h): max |stage - ref| <= 2 max |naive - ref| + 1e-5 max(1, max |ref|), for O and each
gradient, where ref is SDPA in fp32 on the same (rounded) inputs (in fp64 for an fp32 run, which an fp32
reference could not judge) and naive the textbook attention in the run's own precision, eager.
"""
import unittest

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

import flash_step

try:
    GPU_WHY = flash_step.gpu_unavailable_reason()
except flash_step.FlashStepError as e:  # no library: the numpy tests say so
    GPU_WHY = str(e)
if torch is not None and not torch.cuda.is_available():
    GPU_WHY = GPU_WHY or "torch sees no CUDA device"


def expand_kv(x, group):
    """[B, N, Hkv, d] -> [B, N, Hkv * group, d]: query head h reads KV head h / group."""
    return x.repeat_interleave(group, dim=2)


def causal_mask(Nq, Nk, device):
    """Bottom-right: query i sees key j iff j <= i + Nk - Nq (SDPA's is_causal is top-left)."""
    i = torch.arange(Nq, device=device)[:, None]
    return torch.arange(Nk, device=device)[None, :] <= i + (Nk - Nq)


def sdpa(q, k, v, causal, scale):
    """SDPA on [B, N, H, d] tensors, GQA by expanding K and V."""
    g = q.shape[2] // k.shape[2]
    mask = causal_mask(q.shape[1], k.shape[1], q.device) if causal else None
    o = F.scaled_dot_product_attention(q.transpose(1, 2), expand_kv(k, g).transpose(1, 2),
                                       expand_kv(v, g).transpose(1, 2), attn_mask=mask, scale=scale)
    return o.transpose(1, 2)


def naive(q, k, v, causal, scale):
    """The textbook attention in q's dtype, each step rounded to it as eager torch does."""
    g = q.shape[2] // k.shape[2]
    s = torch.einsum("bihd,bjhd->bhij", q, expand_kv(k, g)) * scale
    if causal:
        s = s.masked_fill(~causal_mask(q.shape[1], k.shape[1], q.device), float("-inf"))
    return torch.einsum("bhij,bjhd->bihd", torch.softmax(s, dim=-1), expand_kv(v, g))


def run_with_grads(fn, inputs, dout, backward=True):
    """[O, dQ, dK, dV] of fn on inputs, with dout as O's gradient ([O] alone without the backward)."""
    leaves = [x.detach().clone().requires_grad_(backward) for x in inputs]
    o = fn(*leaves)
    if not backward:
        return [o.detach()]
    o.backward(dout)
    return [o.detach()] + [x.grad for x in leaves]


FORWARD_ONLY = {"step3_naive_kernel", "step4_fused_pipelined"}  # the GPU stages without a backward pass


class Check:
    def check(self, dtype, device, B=2, Nq=128, Nk=128, Hq=4, Hkv=2, d=64, causal=False, stage=None, variant=None,
              backward=True, strided=False, copied=None):
        """Under the rule against SDPA; `strided`: Q, K, V, dO laid out [B, H, N, d] behind their [B, N, H, d]
        views; `copied`: what fs_last_call_copied must say after the last call (the backward's, or the forward's)."""
        torch.manual_seed(0)
        make = lambda *shape: (torch.randn(*shape, device=device) + 0.5).to(dtype)  # noqa: E731
        q, k, v, dout = make(B, Nq, Hq, d), make(B, Nk, Hkv, d), make(B, Nk, Hkv, d), make(B, Nq, Hq, d)
        if strided:
            q, k, v, dout = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v, dout))
        scale = d ** -0.5
        ref_dtype = torch.float64 if dtype in (torch.float32, torch.float64) else torch.float32
        up = lambda *xs: [x.to(ref_dtype) for x in xs]  # noqa: E731
        ref = run_with_grads(lambda q, k, v: sdpa(q, k, v, causal, scale), up(q, k, v), *up(dout))
        base = run_with_grads(lambda q, k, v: naive(q, k, v, causal, scale), [q, k, v], dout)
        got = run_with_grads(lambda q, k, v: flash_step.attention(q, k, v, causal=causal, stage=stage,
                                                                  variant=variant), [q, k, v], dout, backward)
        what = f"{dtype} {device} {stage or 'default'} {variant or ''} causal={causal} Hq={Hq} Hkv={Hkv} d={d}"
        for name, g, r, b in zip(("O", "dQ", "dK", "dV"), got, ref, base):
            self.assertEqual((g.shape, g.dtype), (r.shape, dtype), f"{what}: {name}")
            err = (g.to(ref_dtype) - r).abs().max().item()
            base_err = (b.to(ref_dtype) - r).abs().max().item()
            tol = 2 * base_err + 1e-5 * max(1.0, r.abs().max().item())
            self.assertLessEqual(err, tol, f"{what}: {name} error {err:.3g}, naive {base_err:.3g}")
        if copied is not None:
            self.assertEqual(flash_step.last_call_copied(), copied, what)


@unittest.skipIf(torch is None, "torch is not installed")
class TorchCpu(unittest.TestCase, Check):
    def test_fp32_and_fp64_against_sdpa(self):
        for dtype in (torch.float32, torch.float64):
            for causal in (False, True):
                self.check(dtype, "cpu", Nq=40, Nk=56, d=16, causal=causal)

    def test_varlen_autograd_is_the_c_backward(self):
        """The varlen op's autograd reaches fs_backward_varlen: the same gradients as the numpy call."""
        torch.manual_seed(3)
        cq, ck = [0, 5, 5, 12], [0, 9, 13, 20]
        q, dout = torch.randn(12, 4, 16, dtype=torch.float64), torch.randn(12, 4, 16, dtype=torch.float64)
        k, v = torch.randn(20, 2, 16, dtype=torch.float64), torch.randn(20, 2, 16, dtype=torch.float64)
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        o = flash_step.attention_varlen(*leaves, cq, ck, causal=True)
        o.backward(dout)
        o_np, lse_np = flash_step.attention_varlen(q.numpy(), k.numpy(), v.numpy(), cq, ck, causal=True, return_lse=True)
        grads = flash_step.attention_varlen_backward(dout.numpy(), q.numpy(), k.numpy(), v.numpy(), o_np, lse_np, cq, ck,
                                                     causal=True)
        self.assertTrue(torch.equal(o.detach(), torch.from_numpy(o_np)))
        for leaf, g in zip(leaves, grads):
            self.assertTrue(torch.equal(leaf.grad, torch.from_numpy(g)))

    def test_gradcheck(self):
        """gradcheck's finite differences in fp64 (step 1's reference on the CPU) against the C backward. The
        stages' tensors are fp32 (docs/interface.md), so the inputs and the step are multiples of 2^-10, which
        fp32 holds exactly: the differences see fp64 arithmetic, and the tolerance only the step's O(eps^2)."""
        torch.manual_seed(7)
        q, k, v = ((torch.randn(1, 6, 2, 8, dtype=torch.float64) * 1024).round() / 1024 for _ in range(3))
        inputs = [x.requires_grad_() for x in (q, k, v)]
        self.assertTrue(torch.autograd.gradcheck(lambda q, k, v: flash_step.attention(q, k, v, causal=True), inputs,
                                                 eps=2.0 ** -10, atol=1e-4, rtol=1e-3))

    def test_opcheck(self):
        """torch.library.opcheck on the forward op: its schema, fake tensors, autograd registration and AOT
        dispatch (what torch.compile relies on)."""
        from flash_step import _torch  # noqa: F401
        torch.manual_seed(7)
        q, k, v = (torch.randn(1, 6, 2, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
        for args in ((q, k, v, True, 0.0, None, None), (q, k, v, False, 0.5, None, None)):
            torch.library.opcheck(torch.ops.flash_step.attention_forward.default, args)

    def test_op_is_registered_with_its_schema(self):
        from flash_step import _torch  # noqa: F401  (what a first torch call imports: it registers the ops)
        self.assertTrue(hasattr(torch.ops.flash_step, "attention_forward"))
        self.assertTrue(hasattr(torch.ops.flash_step, "attention_backward"))
        q = torch.randn(1, 8, 2, 8)
        o, lse = flash_step.attention(q, q, q, return_lse=True)
        self.assertEqual((o.shape, lse.shape, lse.dtype), (q.shape, (1, 2, 8), torch.float32))
        self.assertIn("attention_forward", str(torch.ops.flash_step.attention_forward.default._schema))


@unittest.skipIf(torch is None, "torch is not installed")
@unittest.skipIf(torch is not None and GPU_WHY != "", f"no GPU for the GPU stages: {GPU_WHY}")
class TorchGpu(unittest.TestCase, Check):
    def test_default_stage_bf16_fp16(self):
        for dtype in (torch.bfloat16, torch.float16):
            for causal in (False, True):
                for d in (64, 128):
                    self.check(dtype, "cuda", d=d, causal=causal)

    def test_named_stages(self):
        for stage in [name for name, memory in flash_step.stages() if memory == "device"]:
            if stage == "step6_autotune":  # it times candidates on its first call: a benchmark, not a test
                continue
            if stage == "step7_hopper_wgmma" and torch.cuda.get_device_capability()[0] != 9:
                continue
            self.check(torch.bfloat16, "cuda", causal=True, stage=stage, Nq=96, Nk=160,
                       backward=stage not in FORWARD_ONLY)
        self.check(torch.bfloat16, "cuda", stage="step5_backward", variant="atomic")

    def test_zero_copy_and_copy_paths(self):
        """bf16/fp16 tensors run in place on the default stage (the zero-copy path: 7e's forward on an sm_90 GPU,
        else 4g's, and step 5's packed backward reading the O and LSE given; strided inputs made contiguous on the
        device first); a padded head dim and a stage without the path go through the host. All under the rule."""
        for dtype in (torch.bfloat16, torch.float16):
            for d in (64, 128):
                self.check(dtype, "cuda", B=3, Nq=96, Nk=160, Hq=8, Hkv=2, d=d, causal=True, copied=0)
                self.check(dtype, "cuda", B=3, Nq=96, Nk=160, Hq=8, Hkv=2, d=d, causal=True, strided=True, copied=0)
        self.check(torch.bfloat16, "cuda", B=2, Nq=300, Nk=300, Hq=4, Hkv=4, d=64, copied=0)
        self.check(torch.bfloat16, "cuda", d=96, causal=True, copied=1)  # padded, on copies
        self.check(torch.bfloat16, "cuda", stage="step3_naive_kernel", backward=False, copied=1)  # no zero-copy path
        if torch.cuda.get_device_capability()[0] == 9:  # step 7 (7e and step 5's packed backward) in place
            self.check(torch.bfloat16, "cuda", B=3, Nq=96, Nk=160, Hq=8, Hkv=2, d=128, causal=True,
                       stage="step7_hopper_wgmma", copied=0)

    def test_zero_copy_lse_in_any_layout(self):
        """The zero-copy forward writes the LSE in place when laid out [Hq, B, Nq], else through a scratch; the
        backward reads either: the same bits both ways."""
        from flash_step import _lib, _torch
        torch.manual_seed(6)
        B, N, H, d = 3, 200, 4, 64
        q, k, v, dout = ((torch.randn(B, N, H, d, device="cuda") + 0.5).to(torch.bfloat16) for _ in range(4))
        o, lse = flash_step.attention(q, k, v, causal=True, return_lse=True)  # [Hq, B, Nq] underneath
        self.assertEqual((lse.stride(), flash_step.last_call_copied()), ((N, B * N, 1), 0))
        o2, lse2 = torch.empty_like(o), torch.empty(B, H, N, device="cuda")  # contiguous [B, Hq, Nq]
        opts = _torch._options(q, True, None, None, None)
        _lib.forward(opts, *(_torch._view(x) for x in (q, k, v, o2, lse2)))
        self.assertEqual(flash_step.last_call_copied(), 0)
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(o, o2) and torch.equal(lse, lse2))
        grads = [flash_step.attention_backward(dout, q, k, v, o, x, causal=True) for x in (lse, lse2)]
        self.assertEqual(flash_step.last_call_copied(), 0)
        for a, b in zip(*grads):
            self.assertTrue(torch.equal(a, b))

    def test_torch_compile(self):
        """torch.compile(fullgraph=True) through the op, forward and backward: the eager values and gradients."""
        torch.manual_seed(8)
        make = lambda *shape: (torch.randn(*shape, device="cuda") + 0.5).to(torch.bfloat16)  # noqa: E731
        q, k, v, dout = make(2, 128, 4, 64), make(2, 128, 2, 64), make(2, 128, 2, 64), make(2, 128, 4, 64)
        fn = lambda q, k, v: flash_step.attention(q * 1.0, k, v, causal=True)  # noqa: E731  (a torch op around it)
        eager = run_with_grads(fn, [q, k, v], dout)
        compiled = run_with_grads(torch.compile(fn, fullgraph=True), [q, k, v], dout)
        for a, b in zip(eager, compiled):
            self.assertTrue(torch.equal(a, b))

    def test_fp32_on_step3_and_mqa(self):
        self.check(torch.float32, "cuda", stage="step3_naive_kernel", Nq=64, Nk=96, Hq=4, Hkv=1, causal=True,
                   backward=False)  # step 3 has no backward

    def test_head_dims_32_and_96_run_padded(self):
        for d in (32, 96):
            self.check(torch.bfloat16, "cuda", d=d, causal=True, Nq=96, Nk=160)

    def test_forward_only_stage_and_strides(self):
        torch.manual_seed(1)
        qkv = torch.randn(2, 128, 3, 4, 64, device="cuda", dtype=torch.bfloat16)
        q, k, v = qkv.unbind(dim=2)  # strided views of one buffer
        o = flash_step.attention(q, k, v, stage="step4_fused_pipelined")
        o_ref = flash_step.attention(*(x.contiguous() for x in (q, k, v)), stage="step4_fused_pipelined")
        self.assertTrue(torch.equal(o, o_ref))
        with self.assertRaises(flash_step.FlashStepError) as c:  # step 4 has no backward
            flash_step.attention(q.contiguous().requires_grad_(), k, v, stage="step4_fused_pipelined").sum().backward()
        self.assertIn("no backward", str(c.exception))

    def test_kvcache_ragged_and_paged_against_sdpa(self):
        """Decoding from a cache: each sequence's O against SDPA on its own keys (fp32, same rounded inputs),
        under the rule; the paged pool (FlashAttention's layout, pages shuffled) gives the contiguous bits."""
        torch.manual_seed(2)
        B, Nq, Hq, Hkv, d, P = 3, 1, 8, 2, 128, 256
        lens = [1000, 1, 517]
        cap = 4 * P
        make = lambda *shape: (torch.randn(*shape, device="cuda") + 0.5).to(torch.bfloat16)  # noqa: E731
        q, k, v = make(B, Nq, Hq, d), make(B, cap, Hkv, d), make(B, cap, Hkv, d)
        o = flash_step.attention_with_kvcache(q, k, v, cache_seqlens=lens)
        for b, n in enumerate(lens):
            qb, kb, vb = q[b:b + 1].float(), k[b:b + 1, :n].float(), v[b:b + 1, :n].float()
            ref = sdpa(qb, kb, vb, True, d ** -0.5)
            base = naive(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], True, d ** -0.5).float()
            err, base_err = (o[b:b + 1].float() - ref).abs().max().item(), (base - ref).abs().max().item()
            self.assertLessEqual(err, 2 * base_err + 1e-5 * max(1.0, ref.abs().max().item()), f"sequence {b}")
        # The same cache in shuffled pages of P keys: pool [pages, P, Hkv, d], table [B, cap / P].
        pages = B * cap // P
        perm = torch.randperm(pages)
        table = perm.view(B, cap // P).to(torch.int32)
        k_pool = torch.empty(pages, P, Hkv, d, device="cuda", dtype=torch.bfloat16)
        v_pool = torch.empty_like(k_pool)
        k_pool[perm] = k.reshape(pages, P, Hkv, d)
        v_pool[perm] = v.reshape(pages, P, Hkv, d)
        o_paged = flash_step.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens, block_table=table)
        self.assertTrue(torch.equal(o_paged, o))
        self.assertEqual(flash_step.resolve(q, k)[0] != "", True)
        with self.assertRaises(flash_step.FlashStepError) as c:  # a table entry that is no page of the pool
            bad = table.clone()
            bad[0, 0] = pages
            flash_step.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens, block_table=bad)
        self.assertIn("not a page of k_cache", str(c.exception))

    def test_varlen_on_the_gpu_against_sdpa_per_sequence(self):
        """A packed bf16 batch on the GPU (step 4g's forward, step 5's packed backward), O and the
        gradients against SDPA in fp32 on each sequence alone, under the rule; an empty sequence included."""
        torch.manual_seed(5)
        lens_q, lens_k = [37, 0, 300, 1, 129], [37, 5, 300, 64, 200]
        cq, ck = [0], [0]
        for a, b in zip(lens_q, lens_k):
            cq.append(cq[-1] + a)
            ck.append(ck[-1] + b)
        make = lambda *shape: (torch.randn(*shape, device="cuda") + 0.5).to(torch.bfloat16)  # noqa: E731
        q, k, v, dout = make(cq[-1], 8, 64), make(ck[-1], 2, 64), make(ck[-1], 2, 64), make(cq[-1], 8, 64)
        scale = 64 ** -0.5
        got = run_with_grads(lambda q, k, v: flash_step.attention_varlen(q, k, v, cq, ck, causal=True), [q, k, v], dout)

        def per_sequence(fn, dtype):  # each sequence alone, through fn on [1, L, H, d], outputs packed back
            outs = [torch.zeros_like(x, dtype=dtype) for x in (q, q, k, k)]
            for b in range(len(lens_q)):
                qs, ks = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
                if lens_q[b] == 0 or lens_k[b] == 0:
                    continue
                r = run_with_grads(lambda q, k, v: fn(q, k, v, True, scale),
                                   [x[None].to(dtype) for x in (q[qs], k[ks], v[ks])], dout[qs][None].to(dtype))
                for o, x, sl in zip(outs, r, (qs, qs, ks, ks)):
                    o[sl] = x[0]
            return outs

        ref = per_sequence(sdpa, torch.float32)
        base = per_sequence(naive, torch.bfloat16)
        for name, g, r, b in zip(("O", "dQ", "dK", "dV"), got, ref, base):
            err = (g.float() - r).abs().max().item()
            tol = 2 * (b.float() - r).abs().max().item() + 1e-5 * max(1.0, r.abs().max().item())
            self.assertLessEqual(err, tol, f"varlen {name}: error {err:.3g}, tolerance {tol:.3g}")

    def test_refusals(self):
        q = torch.randn(1, 64, 2, 64, device="cuda", dtype=torch.bfloat16)
        with self.assertRaises(flash_step.FlashStepError) as c:
            flash_step.attention(q, q, q, stage="step2_online_softmax")
        self.assertEqual(c.exception.status_name, "FS_UNSUPPORTED")
        self.assertIn("runs on the CPU", str(c.exception))
        q100 = torch.randn(1, 64, 2, 100, device="cuda", dtype=torch.bfloat16)  # 96 runs padded; 100 is no multiple of 8
        with self.assertRaises(flash_step.FlashStepError) as c:
            flash_step.attention(q100, q100, q100, stage="step4_fused_pipelined")
        self.assertIn("head dim", str(c.exception))


if __name__ == "__main__":
    unittest.main()
