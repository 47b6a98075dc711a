"""The [[models.warmup]] tables of a catalog entry, read into its warmup inputs: a torch entry's
(shape, dtype, high) and a checkpoint runtime's (prompt_tokens, batch), each checked against the bounds
of prewarm.catalog_bounds.
"""

from __future__ import annotations

from prewarm.catalog_bounds import MAX_INPUT_TOKENS, check_number, check_shape, check_warmup_list
from prewarm.catalog_entries import TokenWarmupInput, WarmupInput, entry_error

WARMUP_DTYPES = ("float32", "float16", "bfloat16", "int64", "int32", "bool")
_WARMUP_KEYS = {"shape", "dtype", "high"}
_TOKEN_WARMUP_KEYS = {"prompt_tokens", "batch"}


def parse_warmup(where: str, raw: object) -> tuple[WarmupInput, ...]:
    out = []
    for i, w in enumerate(check_warmup_list(where, raw, "shape and dtype")):
        wh = f"{where} warmup[{i}]"
        if not isinstance(w, dict):
            raise entry_error(wh, "must be a table with shape and dtype")
        unknown = set(w) - _WARMUP_KEYS
        if unknown:
            raise entry_error(wh, f"unknown key {sorted(unknown)[0]!r}; allowed: {sorted(_WARMUP_KEYS)}")
        shape = check_shape(wh, w.get("shape"))
        dtype = w.get("dtype", "float32")
        if dtype not in WARMUP_DTYPES:
            raise entry_error(wh, f"dtype {dtype!r} is not one of {', '.join(WARMUP_DTYPES)}")
        high = w.get("high")
        if high is not None:
            check_number(wh, "high", high)
        out.append(WarmupInput(shape, dtype, high))
    return tuple(out)


def parse_token_warmup(where: str, raw: object) -> tuple[TokenWarmupInput, ...]:
    out = []
    for i, w in enumerate(check_warmup_list(where, raw, "prompt_tokens (and batch)")):
        wh = f"{where} warmup[{i}]"
        if not isinstance(w, dict):
            raise entry_error(wh, "must be a table with prompt_tokens and batch")
        unknown = set(w) - _TOKEN_WARMUP_KEYS
        if unknown:
            raise entry_error(wh, f"unknown key {sorted(unknown)[0]!r}; a checkpoint runtime's warmup takes "
                                  f"{', '.join(sorted(_TOKEN_WARMUP_KEYS))}")
        n = check_number(wh, "prompt_tokens", w.get("prompt_tokens"))
        b = check_number(wh, "batch", w.get("batch", 1))
        if n * b > MAX_INPUT_TOKENS:
            raise entry_error(wh, f"prompt_tokens x batch = {n} x {b} = {n * b:,} tokens; at most {MAX_INPUT_TOKENS:,} "
                                  "(MAX_INPUT_TOKENS) are allowed per input")
        out.append(TokenWarmupInput(n, b))
    return tuple(out)

