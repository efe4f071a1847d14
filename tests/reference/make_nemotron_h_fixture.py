#!/usr/bin/env python3
"""Builds tests/reference/nemotron_h_tiny/: a tiny random Nemotron-H run through
HF transformers' NemotronHForCausalLM (PyTorch, CPU, float32), for the C++
test that checks exmy's model against it (tests/models/test_hf_fixture.cpp).

Needs torch, transformers (with models/nemotron_h) and safetensors, e.g.
    python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers safetensors
    /tmp/venv/bin/python tests/reference/make_nemotron_h_fixture.py
CI only reads the committed output; rerun this only to regenerate it.

Written files:
  config.json        the HF config (as save_pretrained writes it)
  model.safetensors  the weights (float32, HF names)
  fixture.safetensors
      input_ids (B,T) I64, targets (B,T) I64 (next token, -100 at the end),
      logits (B,T,V) F32, loss () F64 (mean cross-entropy, computed in F32),
      grad.<parameter name> F32 for every parameter (gradient of that loss)
  versions.json      torch/transformers versions used

Numerics of the reference: HF's Mamba-2 mixer runs its torch fallback
(mamba2_chunk_scan, the chunked SSD in einsums; causal conv via F.conv1d),
since the CUDA kernels are absent on CPU. That fallback clamps dt at
time_step_min from below; exmy follows mamba_ssm's dt_limit = (0, inf)
instead, so the script checks that every dt of the fixture lies above
time_step_min, where the two agree.
"""
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for hub kernels

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file
from transformers import NemotronHConfig, NemotronHForCausalLM

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nemotron_h_tiny")
B, T = 2, 20  # T spans three SSD chunks of 8, the last one partial


def main():
    torch.manual_seed(1234)
    cfg = NemotronHConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        hybrid_override_pattern="M-*M-",
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=8,
        n_groups=2,
        conv_kernel=4,
        chunk_size=8,
        layer_norm_epsilon=1e-5,
        time_step_min=1e-3,
        use_conv_bias=True,
        tie_word_embeddings=False,
        mlp_hidden_act="relu2",
    )
    cfg._attn_implementation = "eager"
    model = NemotronHForCausalLM(cfg).float().eval()

    # Weights of unit-scale signals (HF's 0.02 init would make every layer
    # nearly the identity and hide mistakes).
    g = torch.Generator().manual_seed(99)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.log(torch.rand(p.shape, generator=g) * 7 + 1))
            elif name.endswith("dt_bias"):
                p.copy_(torch.rand(p.shape, generator=g) * 2.5 - 3.0)  # softplus in (0.05, 0.47)
            elif name.endswith(".D"):
                p.copy_(1 + 0.5 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif "conv1d" in name:
                p.copy_(0.4 * torch.randn(p.shape, generator=g))
            elif "embeddings" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:  # linear weights (out, in)
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)

    input_ids = torch.randint(0, cfg.vocab_size, (B, T), generator=g)
    targets = torch.full((B, T), -100, dtype=torch.long)
    targets[:, :-1] = input_ids[:, 1:]

    # Every dt must lie above time_step_min (see the docstring).
    dts = []

    def grab_dt(mixer):
        def hook(module, inputs, output):
            dt_raw = output[..., -mixer.num_heads:]
            dts.append(F.softplus(dt_raw + mixer.dt_bias).min().item())
        return hook

    for layer in model.model.layers:
        if hasattr(layer.mixer, "in_proj"):
            layer.mixer.in_proj.register_forward_hook(grab_dt(layer.mixer))

    model.zero_grad()
    logits = model(input_ids=input_ids).logits  # (B, T, V) float32
    loss = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), targets.reshape(-1), ignore_index=-100)
    loss.backward()
    assert min(dts) > cfg.time_step_min * 2, f"dt {min(dts)} too close to the HF clamp"

    os.makedirs(OUT, exist_ok=True)
    model.save_pretrained(OUT, safe_serialization=True)
    for extra in ("generation_config.json",):
        if os.path.exists(os.path.join(OUT, extra)):
            os.remove(os.path.join(OUT, extra))
    tensors = {
        "input_ids": input_ids.contiguous(),
        "targets": targets.contiguous(),
        "logits": logits.detach().contiguous(),
        "loss": loss.detach().double().reshape(()),
    }
    for name, p in model.named_parameters():
        tensors["grad." + name] = p.grad.detach().contiguous()
    save_file(tensors, os.path.join(OUT, "fixture.safetensors"))
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__,
                   "python": sys.version.split()[0]}, f, indent=2)
        f.write("\n")
    print(f"wrote {OUT}: loss {loss.item():.6f}, min dt {min(dts):.4f}, "
          f"logit range [{logits.min().item():.3f}, {logits.max().item():.3f}]")


if __name__ == "__main__":
    main()
