"""Tokenize a corpus into a prepared folder: tokens.bin (raw uint16/uint32) and meta.json.

tokens.bin is written first, atomically; meta.json (with its length and checksum) is
written last, atomically, so a folder with a meta.json is always complete.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..provenance import atomic_write_bytes, atomic_write_json, provenance
from .corpus import DEFAULT_DESCRIPTION, default_documents, fingerprint, user_documents
from .tokenizer import load_tokenizer

DOCUMENT_SEPARATOR = "\n\n"


def prepare(
    out: str | Path,
    inputs: list[str] | None = None,
    tokenizer: str = "bytes",
    val_fraction: float = 0.01,
    field: str = "text",
) -> dict:
    """Tokenize ``inputs`` (default: the bundled corpus) into ``out``; returns the metadata."""
    if not 0.0 <= val_fraction < 0.5:
        raise ValueError(f"val_fraction must be in [0, 0.5), got {val_fraction}")
    tok = load_tokenizer(tokenizer)
    documents = list(user_documents(inputs, field) if inputs else default_documents())
    ids: list[int] = []
    sep = tok.encode(DOCUMENT_SEPARATOR)
    for doc in tqdm(documents, desc="tokenize", unit="doc", file=sys.stderr):
        ids.extend(tok.encode(doc))
        ids.extend(sep)
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    tokens = np.asarray(ids, dtype=dtype)
    if tokens.size < 1024:
        raise ValueError(f"the corpus has only {tokens.size} tokens; training needs more")
    data = tokens.tobytes()
    out = Path(out)
    atomic_write_bytes(out / "tokens.bin", data)
    meta = {
        "tokenizer": tok.name,
        "vocab_size": tok.vocab_size,
        "dtype": np.dtype(dtype).name,
        "n_tokens": int(tokens.size),
        "n_train": int(tokens.size * (1 - val_fraction)),
        "documents": len(documents),
        "source": [str(Path(p).resolve()) for p in inputs] if inputs else DEFAULT_DESCRIPTION,
        "source_sha256": fingerprint(documents),
        "tokens_sha256": hashlib.sha256(data).hexdigest(),
        "provenance": provenance(),
    }
    atomic_write_json(out / "meta.json", meta)
    return meta
