"""Small random LoRA adapters for the demo's vLLM Llama, written directly as PEFT writes them.

`write_lora_adapter(dir, config, rank=8, seed=0)` writes a PEFT adapter directory (issue 29, item 6):

- adapter_config.json: a LoraConfig (peft_type LORA, r, lora_alpha, target_modules q/k/v/o_proj) as
  PEFT's save_pretrained writes it, the fields vLLM's PEFTHelper reads;
- adapter_model.safetensors: for each decoder layer's attention projections, PEFT's tensor names
  (`base_model.model.model.layers.<i>.self_attn.<p>_proj.lora_A.weight`, shape [r, in_features], and
  `...lora_B.weight`, shape [out_features, r]) with seeded random float32 values. PEFT initialises B to
  zero (an adapter that changes nothing); here B is random too, so each adapter answers differently.

Needs numpy and safetensors only (no torch, no peft): the shapes follow from the base's config.json fields
(hidden_size, num_attention_heads, num_key_value_heads, head_dim, num_hidden_layers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def projection_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in_features, out_features) of each attention projection of a Llama config."""
    hidden = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    return {"q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
            "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden)}


def adapter_tensors(config: dict[str, Any], rank: int, seed: int) -> dict[str, np.ndarray]:
    """PEFT's state dict of a rank-`rank` LoRA on every layer's attention projections (seeded values)."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    shapes = projection_shapes(config)
    for layer in range(int(config["num_hidden_layers"])):
        for proj in TARGETS:
            fan_in, fan_out = shapes[proj]
            name = f"base_model.model.model.layers.{layer}.self_attn.{proj}"
            out[f"{name}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) / np.sqrt(fan_in)).astype(np.float32)
            out[f"{name}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * 0.02).astype(np.float32)
    return out


def adapter_config(rank: int, base: str) -> dict[str, Any]:
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base, "r": rank,
            "lora_alpha": 2 * rank, "lora_dropout": 0.0, "target_modules": list(TARGETS), "bias": "none",
            "fan_in_fan_out": False, "modules_to_save": None, "use_rslora": False, "use_dora": False,
            "inference_mode": True}


def write_lora_adapter(out: str | Path, config: dict[str, Any], *, rank: int = 8, seed: int = 0,
                       base: str = "") -> Path:
    """Write a PEFT adapter directory for a Llama of `config` (its config.json fields) into `out`."""
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(adapter_tensors(config, rank, seed), str(out / "adapter_model.safetensors"),
              metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(adapter_config(rank, base), indent=2, sort_keys=True) + "\n")
    return out
