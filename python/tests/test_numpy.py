"""Tests of the Python package on numpy arrays (the CPU stages through libflash_step.so): fp64 against the
tests' own numpy attention to rounding, fp32 under the tolerance rule, GQA, causal with Nq != Nk (rows that
see no key), strided arrays, the default stage, and the errors. Run by ctest (PythonInterface) or:
    PYTHONPATH=python FLASH_STEP_LIBRARY=build/libflash_step.so /usr/bin/python3 -m unittest discover -s python/tests -v
"""
import unittest

import numpy as np

import flash_step
import reference as ref

SHAPES = [  # (B, Nq, Nk, Hq, Hkv, d)
    (2, 37, 29, 4, 2, 16),  # GQA, Nq > Nk: causal leaves the first rows without a key
    (1, 19, 45, 3, 1, 8),   # MQA, Nq < Nk
]


class Forward(unittest.TestCase):
    def test_fp64_is_the_reference(self):
        for B, Nq, Nk, Hq, Hkv, d in SHAPES:
            for causal in (False, True):
                q, k, v = ref.random_inputs((B, Nq, Hq, d), (B, Nk, Hkv, d), seed=1, dtype=np.float64)
                scale = float(np.float32(0.3))  # the stages keep the scale in fp32 (docs/interface.md)
                o, lse = flash_step.attention(q, k, v, causal=causal, scale=scale, return_lse=True)
                o_ref, lse_ref = ref.forward(q, k, v, causal, scale)
                self.assertEqual((o.dtype, o.shape, lse.dtype, lse.shape),
                                 (np.float64, q.shape, np.float64, (B, Hq, Nq)))
                self.assertLess(ref.max_error(o, o_ref), 1e-12)
                self.assertLess(ref.max_error(lse, lse_ref), 1e-12)
                if causal and Nq > Nk:
                    self.assertTrue(np.all(o[:, : Nq - Nk] == 0) and np.all(lse[:, :, : Nq - Nk] == -np.inf))

    def test_fp32_stages_pass_the_tolerance_rule(self):
        for stage, variant in ((None, None), ("step1_cpu_reference", None), ("step2_online_softmax", "online")):
            for B, Nq, Nk, Hq, Hkv, d in SHAPES:
                for causal in (False, True):
                    q, k, v = ref.random_inputs((B, Nq, Hq, d), (B, Nk, Hkv, d), seed=2)
                    o, lse = flash_step.attention(q, k, v, causal, None, stage, variant, return_lse=True)
                    scale = 1 / np.sqrt(d)
                    exact = ref.forward(*(x.astype(np.float64) for x in (q, k, v)), causal, scale)
                    naive = ref.forward(q, k, v, causal, scale)
                    for got, want, base, name in zip((o, lse), exact, naive, ("O", "LSE")):
                        err = ref.max_error(got, want)
                        self.assertLessEqual(err, ref.tolerance(ref.max_error(base, want), want),
                                             f"{stage} {variant} {name} causal={causal}")


class Backward(unittest.TestCase):
    def test_fp64_is_the_reference(self):
        for B, Nq, Nk, Hq, Hkv, d in SHAPES:
            for causal in (False, True):
                q, k, v, do = ref.random_inputs((B, Nq, Hq, d), (B, Nk, Hkv, d), seed=3, dtype=np.float64,
                                                backward=True)
                scale = float(np.float32(1 / np.sqrt(d)))  # the default, 1/sqrt(d), as the stages keep it: fp32
                o, lse = flash_step.attention(q, k, v, causal=causal, return_lse=True)
                grads = flash_step.attention_backward(do, q, k, v, o, lse, causal=causal)
                for got, want in zip(grads, ref.backward(do, q, k, v, causal, scale)):
                    self.assertEqual(got.shape, want.shape)
                    self.assertLess(ref.max_error(got, want), 1e-12)

    def test_fp32_passes_the_tolerance_rule(self):
        for stage in (None, "step1_cpu_reference"):
            for B, Nq, Nk, Hq, Hkv, d in SHAPES:
                for causal in (False, True):
                    q, k, v, do = ref.random_inputs((B, Nq, Hq, d), (B, Nk, Hkv, d), seed=4, backward=True)
                    o, lse = flash_step.attention(q, k, v, causal=causal, stage=stage, return_lse=True)
                    grads = flash_step.attention_backward(do, q, k, v, o, lse, causal=causal, stage=stage)
                    scale = 1 / np.sqrt(d)
                    exact = ref.backward(*(x.astype(np.float64) for x in (do, q, k, v)), causal, scale)
                    naive = ref.backward(do, q, k, v, causal, scale)
                    for got, want, base, name in zip(grads, exact, naive, ("dQ", "dK", "dV")):
                        self.assertLessEqual(ref.max_error(got, want),
                                             ref.tolerance(ref.max_error(base, want), want),
                                             f"{stage} {name} causal={causal}")


class Strides(unittest.TestCase):
    def test_strided_arrays_give_the_contiguous_values(self):
        B, N, H, d = 2, 33, 4, 16
        qkv = ref.random_inputs((B, N, 3, H, d), (1, 1, 1, 1), seed=5)[0]  # a fused projection's output
        q, k, v = qkv[:, :, 0], qkv[:, ::-1, 1], qkv[:, :, 2]              # k reversed: a negative stride
        qt = np.ascontiguousarray(q.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)  # [B, H, N, d] memory
        self.assertFalse(q.flags.c_contiguous or k.flags.c_contiguous or qt.flags.c_contiguous)
        self.assertLess(k.strides[1], 0)
        contiguous = [np.ascontiguousarray(x) for x in (q, k, v)]
        o_ref, lse_ref = flash_step.attention(*contiguous, causal=True, return_lse=True)
        for args in ((q, k, v), (qt, k, v)):
            o, lse = flash_step.attention(*args, causal=True, return_lse=True)
            np.testing.assert_array_equal(o, o_ref)
            np.testing.assert_array_equal(lse, lse_ref)
        do = np.ones_like(o_ref)[:, :, :, :]
        grads_ref = flash_step.attention_backward(do, *contiguous, o_ref, lse_ref, causal=True)
        do_broadcast = np.broadcast_to(np.float32(1), o_ref.shape)  # every stride 0
        grads = flash_step.attention_backward(do_broadcast, q, k, v, o_ref, lse_ref, causal=True)
        for got, want in zip(grads, grads_ref):
            np.testing.assert_array_equal(got, want)


class Varlen(unittest.TestCase):
    def test_each_sequence_as_if_alone(self):
        """A packed batch ([total, H, d], cu_seqlens) gives each sequence what the dense call gives it alone
        (fp64: the reference), empty sequences included; the backward's gradients too."""
        lq, lk, Hq, Hkv, d = [5, 0, 7, 3], [9, 4, 7, 0], 4, 2, 16
        cq, ck = np.concatenate([[0], np.cumsum(lq)]), np.concatenate([[0], np.cumsum(lk)])
        rng = np.random.default_rng(3)
        q, dout = (rng.standard_normal((cq[-1], Hq, d)) + 0.5 for _ in range(2))
        k, v = (rng.standard_normal((ck[-1], Hkv, d)) + 0.5 for _ in range(2))
        scale = float(np.float32(0.3))
        o, lse = flash_step.attention_varlen(q, k, v, cq, ck, causal=True, scale=scale, return_lse=True)
        dq, dk, dv = flash_step.attention_varlen_backward(dout, q, k, v, o, lse, cq, ck, causal=True, scale=scale)
        self.assertEqual((o.shape, lse.shape, dq.shape, dk.shape), (q.shape, (Hq, cq[-1]), q.shape, k.shape))
        for b in range(len(lq)):
            sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
            if lq[b] == 0:
                continue
            if lk[b] == 0:
                self.assertTrue(np.all(o[sq] == 0) and np.all(lse[:, sq] == -np.inf) and np.all(dq[sq] == 0))
                continue
            one = lambda x, s: np.ascontiguousarray(x[s][None])  # noqa: E731  [1, L, H, d]
            ob, lb = flash_step.attention(one(q, sq), one(k, sk), one(v, sk), causal=True, scale=scale, return_lse=True)
            gb = flash_step.attention_backward(one(dout, sq), one(q, sq), one(k, sk), one(v, sk), ob, lb, causal=True,
                                               scale=scale)
            self.assertLess(ref.max_error(o[sq], ob[0]), 1e-12, f"O of sequence {b}")
            self.assertLess(ref.max_error(lse[:, sq], lb[0]), 1e-12, f"LSE of sequence {b}")
            for name, g, gr in zip(("dQ", "dK", "dV"), (dq[sq], dk[sk], dv[sk]), gb):
                self.assertLess(ref.max_error(g, gr[0]), 1e-12, f"{name} of sequence {b}")
        with self.assertRaises(flash_step.FlashStepError) as c:
            flash_step.attention_varlen(q, k, v, cq[:-1], ck[:-1])
        self.assertIn("cu_seqlens", str(c.exception))


class KvCache(unittest.TestCase):
    def test_ragged_and_paged_caches_are_each_sequence_on_its_keys(self):
        """On the host, step 1 reads a KV cache (fp64: the reference): sequence b's queries against its first
        cache_seqlens[b] keys, causal bottom-right; the same cache in shuffled pages gives the same values."""
        B, Nq, cap, Hq, Hkv, d, P = 3, 2, 24, 4, 2, 16, 8
        q, k, v = ref.random_inputs((B, Nq, Hq, d), (B, cap, Hkv, d), seed=5, dtype=np.float64)
        lens = [24, 9, 2]
        o = flash_step.attention_with_kvcache(q, k, v, cache_seqlens=lens)
        for b, n in enumerate(lens):
            ob = flash_step.attention(q[b:b + 1], k[b:b + 1, :n], v[b:b + 1, :n], causal=True)
            self.assertLess(ref.max_error(o[b:b + 1], ob), 1e-12, f"sequence {b}")
        per_seq = cap // P
        order = np.random.default_rng(1).permutation(B * per_seq)  # logical page i lives in physical page order[i]
        k_pool, v_pool = np.empty((B * per_seq, P, Hkv, d)), np.empty((B * per_seq, P, Hkv, d))
        k_pool[order], v_pool[order] = k.reshape(-1, P, Hkv, d), v.reshape(-1, P, Hkv, d)
        table = order.reshape(B, per_seq).astype(np.int32)
        o_paged = flash_step.attention_with_kvcache(q, k_pool, v_pool, cache_seqlens=lens, block_table=table)
        self.assertTrue(np.array_equal(o_paged, o))


class Interface(unittest.TestCase):
    def test_version_stages_and_defaults(self):
        self.assertEqual(flash_step.version() // 1000, 1)
        stages = flash_step.stages()
        self.assertEqual(stages[:2], [("step1_cpu_reference", "host"), ("step2_online_softmax", "host")])
        q, k, v = ref.random_inputs((1, 8, 2, 8), (1, 8, 2, 8), seed=6)
        self.assertEqual(flash_step.resolve(q, k), ("step2_online_softmax", "fa2"))
        self.assertEqual(flash_step.resolve(q.astype(np.float64), k.astype(np.float64)), ("step1_cpu_reference", ""))
        self.assertEqual(flash_step.resolve(q, k, stage="step2_online_softmax", backward=True),
                         ("step2_online_softmax", "fa1"))

    def test_errors(self):
        q, k, v = ref.random_inputs((2, 8, 4, 16), (2, 8, 2, 16), seed=7)

        def raises(kind, piece, call):
            with self.assertRaises(kind) as c:
                call()
            self.assertIn(piece, str(c.exception))
            return c.exception

        e = raises(flash_step.FlashStepError, "k has batch 1, q 2", lambda: flash_step.attention(q, k[:1], v[:1]))
        self.assertEqual(e.status_name, "FS_INVALID_ARGUMENT")
        raises(flash_step.FlashStepError, "v has size [2, 7, 2, 16], expected [2, 8, 2, 16]",
               lambda: flash_step.attention(q, k, v[:, :7]))
        raises(flash_step.FlashStepError, "not a multiple of k's 3",
               lambda: flash_step.attention(q, np.zeros((2, 8, 3, 16), np.float32), np.zeros((2, 8, 3, 16), np.float32)))
        e = raises(flash_step.FlashStepError, "no stage named 'step9'", lambda: flash_step.attention(q, k, v, stage="step9"))
        self.assertEqual(e.status_name, "FS_UNKNOWN_STAGE")
        e = raises(flash_step.FlashStepError, "cannot run this call",
                   lambda: flash_step.attention_backward(q, q, k, v, q, np.zeros((2, 4, 8), np.float32),
                                                         stage="step2_online_softmax", variant="online"))
        self.assertEqual(e.status_name, "FS_UNSUPPORTED")
        raises(flash_step.FlashStepError, "softmax_scale must be positive", lambda: flash_step.attention(q, k, v, scale=-1))
        raises(TypeError, "float32 or float64", lambda: flash_step.attention(*(x.astype(np.float16) for x in (q, k, v))))
        raises(TypeError, "give them one dtype", lambda: flash_step.attention(q, k.astype(np.float64), v))
        raises(TypeError, "not a numpy array", lambda: flash_step.attention(q.tolist(), k, v))
        raises(ValueError, "attention takes [B, N, H, d]", lambda: flash_step.attention(q[0], k[0], v[0]))
        e = raises(flash_step.FlashStepError, "reads no KV cache",  # step 2 has no KV-cache path (step 1 has)
                   lambda: flash_step.attention_with_kvcache(q, k, v, cache_seqlens=[8, 5], stage="step2_online_softmax"))
        self.assertEqual(e.status_name, "FS_UNSUPPORTED")


if __name__ == "__main__":
    unittest.main()
