"""A small decoder-only LLM served the way engines serve it, in plain PyTorch: one prefill
iteration over a batch of prompts, then decode iterations of one token per sequence that read
the whole KV cache, each decode iteration replayed from a CUDA graph; then a second batch's
prefill and its decode. Random weights (nothing is fetched). No engine ranges are recorded:
iterations must be found from the graph launches and the kernels.

    python decode_loop.py OUT.json.gz FACTS.json

FACTS.json keeps what the script knows (batch, prompt length, tokens decoded, bytes of
weights and KV cache) as the truth a diagnosis is checked against."""

from __future__ import annotations

import json
import sys

import torch
from torch import nn
from torch.nn import functional as fn


class Layer(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1 = nn.RMSNorm(d)
        self.qkv = nn.Linear(d, 3 * d, bias=False)
        self.o = nn.Linear(d, d, bias=False)
        self.norm2 = nn.RMSNorm(d)
        self.gate_up = nn.Linear(d, 8 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)

    def forward(
        self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor
    ) -> torch.Tensor:
        b, t, d = x.shape
        hd = d // self.heads
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, hd).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        idx = pos + torch.arange(t, device=x.device)
        k_cache.index_copy_(2, idx, k)
        v_cache.index_copy_(2, idx, v)
        span = torch.arange(k_cache.shape[2], device=x.device)
        mask = span[None, :] <= idx[:, None]  # causal over what the cache holds
        a = fn.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=mask)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        g, u = self.gate_up(self.norm2(x)).chunk(2, -1)
        return x + self.down(fn.silu(g) * u)


class Decoder(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(Layer(d, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(
        self, ids: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]], pos: torch.Tensor
    ) -> torch.Tensor:
        x = self.emb(ids)
        for layer, (kc, vc) in zip(self.layers, caches, strict=True):
            x = layer(x, kc, vc, pos)
        return self.head(self.norm(x[:, -1]))


def main(out: str, facts_out: str) -> None:
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    vocab, d, n_layers, heads = (32000, 2048, 8, 16) if cuda else (512, 64, 2, 4)
    batch, prompt, new_tokens, max_len = (8, 512, 24, 1024) if cuda else (2, 16, 4, 64)
    torch.manual_seed(0)
    model = Decoder(vocab, d, n_layers, heads).to(dev, dtype).eval()
    hd = d // heads
    caches = [
        (
            torch.zeros(batch, heads, max_len, hd, device=dev, dtype=dtype),
            torch.zeros(batch, heads, max_len, hd, device=dev, dtype=dtype),
        )
        for _ in range(n_layers)
    ]
    pos = torch.zeros((), dtype=torch.long, device=dev)
    tok = torch.zeros(batch, 1, dtype=torch.long, device=dev)
    graph = None
    with torch.inference_mode():
        logits = torch.empty(batch, vocab, device=dev, dtype=dtype)
        if cuda:  # capture one decode iteration (static shapes: pos and tok are tensors)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):
                    model(tok, caches, pos)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                logits = model(tok, caches, pos)
            torch.cuda.synchronize()

        def serve(prompts: torch.Tensor) -> None:
            pos.zero_()
            first = model(prompts, caches, pos)  # prefill: every prompt token at once
            tok.copy_(first.argmax(-1, keepdim=True))
            pos.fill_(prompts.shape[1])
            for _ in range(new_tokens):  # decode: one token per sequence per iteration
                if graph is not None:
                    graph.replay()
                else:
                    logits.copy_(model(tok, caches, pos))
                tok.copy_(logits.argmax(-1, keepdim=True))  # greedy sampling
                pos.add_(1)
            tok.cpu()  # the engine reads its tokens back (detokenisation)

        acts = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
            for _ in range(2):
                serve(torch.randint(0, vocab, (batch, prompt), device=dev))
    prof.export_chrome_trace(out)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    facts = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "batch": batch,
        "prompt_tokens": prompt,
        "decode_iterations_per_request_batch": new_tokens,
        "request_batches": 2,
        "layers": n_layers,
        "d_model": d,
        "weight_bytes": weight_bytes,
        "kv_cache_bytes_allocated": sum(2 * k.numel() * k.element_size() for k, _ in caches),
        "decode_graph": graph is not None,
    }
    with open(facts_out, "w") as f:
        json.dump(facts, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
