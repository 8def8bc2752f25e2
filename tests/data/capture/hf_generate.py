"""Hugging Face `generate` of a small Llama-shaped model with random weights (nothing is
fetched), profiled: prefill of a batch of prompts, then greedy decode with the library's own
KV cache, eager. A serving trace from a real library's own decode loop.

    python hf_generate.py OUT.json.gz FACTS.json"""

from __future__ import annotations

import json
import sys

import torch


def main(out: str, facts_out: str) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    cfg = LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=2048,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(dev, dtype).eval()
    batch, prompt, new = 4, 256, 16
    ids = torch.randint(0, cfg.vocab_size, (batch, prompt), device=dev)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)  # warm-up
        acts = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            acts.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()
        with torch.profiler.profile(activities=acts, record_shapes=True) as prof:
            model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
    prof.export_chrome_trace(out)
    facts = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "dtype": str(dtype),
        "batch": batch,
        "prompt_tokens": prompt,
        "new_tokens": new,
        "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
    }
    with open(facts_out, "w") as f:
        json.dump(facts, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
