"""Tokenize a corpus into a prepared folder: tokens.bin (raw uint16/uint32) and meta.json.

tokens.bin is written first, atomically; meta.json (with its length and checksum) is
written last, atomically, so a folder with a meta.json is always complete.

The default folder (the bundled corpus, byte tokens) prepares itself on first use:
``prepare_default_once`` lets the first of several processes prepare it under a file
lock while the others wait on the lock, then find it complete.
"""

from __future__ import annotations

import fcntl
import hashlib
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..provenance import atomic_write_bytes, atomic_write_json, provenance
from .corpus import DEFAULT_DESCRIPTION, default_documents, fingerprint, user_documents
from .tokenizer import load_tokenizer

DOCUMENT_SEPARATOR = "\n\n"
DEFAULT_FOLDER = "data/tokens/shakespeare-bytes"  # relative to the working directory, as the CLIs take it


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


def is_default_folder(folder: str | Path) -> bool:
    return Path(folder).resolve() == Path(DEFAULT_FOLDER).resolve()


def prepare_default_once(folder: str | Path = DEFAULT_FOLDER) -> bool:
    """Prepare the bundled corpus into ``folder`` unless it is already there; True if this call did.
    Safe to call from every rank at once: one prepares, the others block on the lock."""
    folder = Path(folder)
    if (folder / "meta.json").exists():
        return False
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also if this process dies
        if (folder / "meta.json").exists():
            return False
        print(f"fp4quant.data: preparing the bundled corpus into {folder} (first use)", file=sys.stderr)
        prepare(folder)
        return True
