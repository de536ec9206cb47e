"""Tokenize a corpus into a prepared folder: tokens.bin (raw uint16/uint32) and meta.json.

An old meta.json is removed first; tokens.bin is written next, atomically; meta.json (with
its length and checksum) last, atomically, so a folder with a meta.json is always complete.

The default folder (the bundled corpus, byte tokens) prepares itself on first use:
``prepare_default_once`` lets the first of several processes prepare it under a file
lock while the others wait on the lock, then find it complete.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from ..provenance import atomic_write_bytes, atomic_write_json, provenance
from .corpus import DEFAULT_DESCRIPTION, PrepareError, default_documents, fingerprint, user_documents
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
    """Tokenize ``inputs`` (default: the bundled corpus) into ``out``; returns the metadata.

    Bad input raises PrepareError (or OSError, e.g. a missing file), each naming the file and the
    problem in one line; ``out`` is checked first, so an unwritable folder fails before the slow part."""
    if not 0.0 <= val_fraction < 0.5:
        raise PrepareError(f"val_fraction must be in [0, 0.5), got {val_fraction}")
    out = Path(out)
    _check_writable(out)
    tok = load_tokenizer(tokenizer)
    documents = list(user_documents(inputs, field) if inputs else default_documents())
    ids: list[int] = []
    sep = tok.encode(DOCUMENT_SEPARATOR)
    # the bar only on a terminal, and erased when done: what stays on stderr is one line of result or error
    for doc in tqdm(documents, desc="tokenize", unit="doc", file=sys.stderr, disable=None, leave=False):
        ids.extend(tok.encode(doc))
        ids.extend(sep)
    if len(ids) < 1024:
        raise PrepareError(f"the corpus ({_describe(inputs)}) has only {len(ids)} tokens; training needs at least 1024")
    tokens = np.asarray(ids)
    if tokens.min() < 0 or tokens.max() >= tok.vocab_size:  # else stored wrapped, or refused only when training
        raise PrepareError(f"the tokenizer {tok.name} gave ids in [{tokens.min()}, {tokens.max()}], outside its "
                           f"vocabulary of {tok.vocab_size}")
    dtype = np.uint16 if tok.vocab_size <= 1 << 16 else np.uint32
    tokens = tokens.astype(dtype)
    data = tokens.tobytes()
    # a re-prepared folder loses its meta.json first: until the new one lands, readers find it unprepared
    # rather than the new tokens.bin under the old meta.json
    (out / "meta.json").unlink(missing_ok=True)
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


def _describe(inputs: list[str] | None) -> str:
    if not inputs:
        return "the bundled corpus"
    return ", ".join(inputs[:3]) + (f" and {len(inputs) - 3} more" if len(inputs) > 3 else "")


def _check_writable(out: Path) -> None:
    """Refuse an ``out`` that cannot be made or written, before the slow part, creating nothing (a refused
    run leaves no empty folder behind).  The OSError's subclass follows its errno, as callers expect."""
    base = out
    while not base.exists() and base != base.parent:  # the nearest existing folder, where mkdir would start
        base = base.parent
    if not base.is_dir():
        raise OSError(errno.ENOTDIR, f"cannot write the prepared folder {out} ({base} is a file, not a folder)")
    if not os.access(base, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, f"cannot write the prepared folder {out} ({base} is not writable)")


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
