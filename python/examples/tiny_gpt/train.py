"""FlashAttention, step by step — python/examples/tiny_gpt/train.py: the kernels in a real model.

A byte-level GPT (4 layers, 4 heads of d = 64, 3.3 M parameters, 256-token context) trained twice from one seed
on the same batches: once with PyTorch's scaled_dot_product_attention, once with this project's kernels through
flash_step's torch op (forward and autograd backward, bf16). Then greedy generation from the trained model, once
by recomputing the whole context with SDPA, once through a paged KV cache (flash_step.attention_with_kvcache:
the keys and values of each layer written into shuffled pages, a block table, step 4's split-KV kernel).
The corpus is the course's own text (every Markdown file of the repository): nothing is downloaded.

    PYTHONPATH=python FLASH_STEP_LIBRARY=build/libflash_step.so python3 python/examples/tiny_gpt/train.py --out run.json
    /usr/bin/python3 python/examples/tiny_gpt/plot.py run.json loss.png          # the two loss curves

Needs a GPU that runs the GPU stages, and torch >= 2.4.
"""
import argparse
import glob
import json
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import flash_step  # noqa: E402


def corpus(root):
    """The repository's Markdown files (build folders left out), as one byte string."""
    files = [f for f in sorted(glob.glob(os.path.join(root, "**", "*.md"), recursive=True))
             if not any(part.startswith(("build", ".")) for part in os.path.relpath(f, root).split(os.sep)[:-1])]
    data = b"\n".join(open(f, "rb").read() for f in files)
    return torch.tensor(list(data), dtype=torch.long), len(files)


def sdpa(q, k, v):  # [B, N, H, d] -> [B, N, H, d], causal
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True).transpose(1, 2)


def ours(q, k, v):
    return flash_step.attention(q, k, v, causal=True)


class Block(nn.Module):
    def __init__(self, dm, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dm), nn.LayerNorm(dm)
        self.qkv, self.proj = nn.Linear(dm, 3 * dm), nn.Linear(dm, dm)
        self.mlp = nn.Sequential(nn.Linear(dm, 4 * dm), nn.GELU(), nn.Linear(4 * dm, dm))

    def qkv_heads(self, x):  # [B, N, dm] -> q, k, v [B, N, H, d] (strided views of one buffer)
        B, N, dm = x.shape
        return [t.reshape(B, N, self.heads, dm // self.heads) for t in self.qkv(self.ln1(x)).split(dm, dim=-1)]

    def finish(self, x, o):  # the attention's output o [B, N, H, d] -> the block's output
        x = x + self.proj(o.reshape(x.shape))
        return x + self.mlp(self.ln2(x))

    def forward(self, x, attend):
        return self.finish(x, attend(*self.qkv_heads(x)))


class GPT(nn.Module):
    def __init__(self, vocab=256, dm=256, heads=4, layers=4, context=256):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dm), nn.Embedding(context, dm)
        self.blocks = nn.ModuleList(Block(dm, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dm), nn.Linear(dm, vocab, bias=False)

    def embed(self, idx, start=0):
        return self.tok(idx) + self.pos(torch.arange(start, start + idx.shape[1], device=idx.device))

    def forward(self, idx, attend):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x, attend)
        return self.head(self.ln(x))


def batches(data, steps, batch, context, seed):
    """The same sequence of random windows for both runs."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        ix = torch.randint(len(data) - context - 1, (batch,), generator=g)
        x = torch.stack([data[i:i + context] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + context] for i in ix])
        yield x.cuda(non_blocking=True), y.cuda(non_blocking=True)


def loss_of(model, x, y, attend):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x, attend)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def train(name, attend, train_data, val_data, a):
    torch.manual_seed(a.seed)
    model = GPT(context=a.context).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = max(1, a.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / a.steps)))))
    val = list(batches(val_data, 4, a.batch, a.context, a.seed + 1))
    losses, vals, times = [], [], []
    for step, (x, y) in enumerate(batches(train_data, a.steps, a.batch, a.context, a.seed)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = loss_of(model, x, y, attend)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        losses.append(round(loss.item(), 4))  # the record keeps four decimals: the curves need no more
        if step % a.eval_every == 0 or step == a.steps - 1:
            with torch.no_grad():
                v = statistics.mean(loss_of(model, vx, vy, attend).item() for vx, vy in val)
            vals.append([step, round(v, 4)])
            print(f"[{name}] step {step + 1}/{a.steps}: loss {losses[-1]:.3f}, validation {v:.3f}, "
                  f"{a.batch * a.context / statistics.median(times[-20:]):.0f} tokens/s", flush=True)
    tps = a.batch * a.context / statistics.median(times[5:] or times)
    return model, {"loss": losses, "val": vals, "tokens_per_s": tps, "step_s_median": statistics.median(times[5:] or times)}


@torch.no_grad()
def generate_sdpa(model, prompt, n, context):
    """Greedy: each token from the whole context, recomputed with SDPA."""
    tokens = list(prompt)
    for _ in range(n):
        idx = torch.tensor(tokens[-context:], device="cuda")[None]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            tokens.append(int(model(idx, sdpa)[0, -1].argmax()))
    return tokens[len(prompt):]


@torch.no_grad()
def generate_paged(model, prompt, n, context, page):
    """Greedy through a paged KV cache: each layer's keys and values go into pages of `page` keys, scattered over a
    pool by a block table; every step runs only the new token's queries (the prompt's, then one)."""
    heads, d = model.blocks[0].heads, model.tok.embedding_dim // model.blocks[0].heads
    per_seq = context // page
    pool = 2 * per_seq  # more pages than the sequence uses, as in a shared pool
    table = torch.randperm(pool, generator=torch.Generator().manual_seed(7))[:per_seq].to(torch.int32)[None]
    k_pools = [torch.zeros(pool, page, heads, d, device="cuda", dtype=torch.bfloat16) for _ in model.blocks]
    v_pools = [torch.zeros_like(p) for p in k_pools]

    def run(new, start):  # logits of tokens `new` at positions start .. start + len - 1
        idx = torch.tensor(new, device="cuda")[None]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            x = model.embed(idx, start)
            for b, kp, vp in zip(model.blocks, k_pools, v_pools):
                q, k, v = b.qkv_heads(x)
                for t in range(len(new)):
                    pos = start + t
                    page_of = int(table[0, pos // page])
                    kp[page_of, pos % page] = k[0, t]
                    vp[page_of, pos % page] = v[0, t]
                o = flash_step.attention_with_kvcache(q, kp, vp, cache_seqlens=[start + len(new)], block_table=table,
                                                      causal=True)
                x = b.finish(x, o)
            return model.head(model.ln(x))

    tokens, logits = [], run(list(prompt), 0)
    for step in range(n):
        tokens.append(int(logits[0, -1].argmax()))
        if len(prompt) + len(tokens) >= context:
            break
        logits = run([tokens[-1]], len(prompt) + step)
    return tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="the run's record (JSON)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--generate", type=int, default=100, help="greedy tokens after the prompt")
    ap.add_argument("--page", type=int, default=128, help="keys per page of the KV cache")
    a = ap.parse_args()
    if not torch.cuda.is_available() or flash_step.gpu_unavailable_reason():
        sys.exit(f"train.py needs a GPU for the GPU stages: {flash_step.gpu_unavailable_reason() or 'torch sees none'}")
    data, files = corpus(ROOT)
    cut = int(0.9 * len(data))
    print(f"corpus: {len(data)} bytes from {files} Markdown files; {torch.cuda.get_device_name()}", flush=True)
    rec = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "corpus_bytes": len(data),
           "corpus_files": files, "steps": a.steps, "batch": a.batch, "context": a.context, "seed": a.seed, "lr": a.lr}
    model_s, rec["sdpa"] = train("sdpa", sdpa, data[:cut], data[cut:], a)
    model_f, rec["flash_step"] = train("flash_step", ours, data[:cut], data[cut:], a)
    x = data[:a.context].cuda()[None]  # one context of the corpus: the trained model's logits with both attentions
    with torch.no_grad():
        s, f = model_f(x, sdpa), model_f(x, ours)
    rec["params"] = sum(p.numel() for p in model_f.parameters())
    rec["same_model_logits_max_diff"] = (s.float() - f.float()).abs().max().item()
    prompt = list(b"FlashAttention computes attention ")
    g_sdpa = generate_sdpa(model_f, prompt, a.generate, a.context)
    g_paged = generate_paged(model_f, prompt, a.generate, a.context, a.page)
    same = next((i for i, (p, q) in enumerate(zip(g_sdpa, g_paged)) if p != q), min(len(g_sdpa), len(g_paged)))
    rec["generation"] = {"prompt": bytes(prompt).decode(), "page": a.page, "sdpa": bytes(g_sdpa).decode(errors="replace"),
                         "paged": bytes(g_paged).decode(errors="replace"), "same_tokens": same, "tokens": len(g_sdpa)}
    print(f"greedy tokens equal for the first {same} of {len(g_sdpa)}\nSDPA : {rec['generation']['sdpa']!r}\n"
          f"paged: {rec['generation']['paged']!r}", flush=True)
    for n in ("sdpa", "flash_step"):
        r = rec[n]
        print(f"{n}: loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f}, validation {r['val'][-1][1]:.3f}, "
              f"{r['tokens_per_s']:.0f} tokens/s", flush=True)
    with open(a.out, "w") as fh:
        json.dump(rec, fh, separators=(",", ":"))  # one line: 2,000 steps of losses stay small


if __name__ == "__main__":
    main()
