"""Tiny Hugging Face checkpoints for the `transformers` and `vllm` runtimes, made locally.

`write_tiny_llama(dir)` writes a random-weights Llama (hidden 128, 2 layers, vocab 2,048, bf16) as
transformers writes it (config.json, model.safetensors or shards with model.safetensors.index.json,
generation_config.json) and a byte-level BPE tokenizer trained here on a built-in text (tokenizer.json,
tokenizer_config.json), so text prompts work. No hub, no network. The weights are random: the text a
model generates is nonsense, its shapes, bytes and latencies are real.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# A few paragraphs to learn merges from: what the tokenizer sees decides only how text splits.
_TEXT = """\
prewarm keeps inference fleets out of cold starts. It watches how often each model is requested,
forecasts which models are about to get traffic, and loads and warms them onto GPUs before the requests
arrive; it evicts models that have gone quiet, so GPU memory goes where demand is.
A request that lands on a GPU where its model is not loaded waits for the model to be read from storage,
copied to the device, deserialised and warmed up: seconds to minutes. Keeping every model resident
everywhere wastes most of the fleet's memory. The scheduler plans, the worker loads, the router routes.
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs. How vexingly quick
daft zebras jump! Sphinx of black quartz, judge my vow. 0 1 2 3 4 5 6 7 8 9 10 100 1000 + - * / = ( ) .
Hello, world. Once upon a time there was a small model that wanted to be warm when its users came.
"""
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")


def tiny_llama_config(*, vocab: int = 2048, hidden: int = 128, layers: int = 2, heads: int = 4,
                      kv_heads: int = 2, max_positions: int = 2048) -> dict[str, Any]:
    """The config.json fields of the demo Llama (what transformers' LlamaConfig would write)."""
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": hidden, "intermediate_size": hidden * 2, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": hidden // heads,
            "max_position_embeddings": max_positions, "rms_norm_eps": 1e-5, "hidden_act": "silu",
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3,
            "rope_theta": 10000.0, "dtype": "bfloat16"}


def write_tokenizer(out: Path, vocab: int = 2048) -> int:
    """Train a byte-level BPE on the built-in text and save it as a transformers fast tokenizer of exactly
    `vocab` ids; returns how many of them are learned merges (the rest are named filler tokens)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_TEXT.splitlines(), trainer=trainer)
    learned = tok.get_vocab_size()
    # A small text learns fewer merges than the model has ids: name the rest, so that every id a model
    # generates decodes to some text (random weights generate any id).
    tok.add_tokens([f"<t{i}>" for i in range(tok.get_vocab_size(), vocab)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>", model_max_length=2048)
    fast.save_pretrained(out)
    return learned


def write_tiny_llama(out: str | Path, *, seed: int = 0, shard_bytes: int | None = None, vocab: int = 2048,
                     hidden: int = 128, layers: int = 2) -> Path:
    """Write the tiny Llama checkpoint into `out` (created); `shard_bytes` splits the weights into shards
    with an index. Returns the directory."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    fields = tiny_llama_config(vocab=vocab, hidden=hidden, layers=layers)
    config = LlamaConfig(**{k: v for k, v in fields.items() if k not in ("architectures", "model_type")})
    config.architectures = ["LlamaForCausalLM"]
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    with torch.device("cpu"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():  # small random weights: finite logits in bf16, deterministic for a seed
        for p in model.parameters():
            p.copy_((torch.randn(p.shape, generator=gen) * 0.02).to(p.dtype))
    kwargs: dict[str, Any] = {"safe_serialization": True}
    if shard_bytes:
        kwargs["max_shard_size"] = shard_bytes
    model.save_pretrained(out, **kwargs)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3).save_pretrained(out)
    write_tokenizer(out, vocab)
    # transformers writes the config it holds; make sure the fields the runtimes rely on are explicit.
    cfg = json.loads((out / "config.json").read_text())
    cfg.setdefault("architectures", ["LlamaForCausalLM"])
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return out
