"""Tokenizers: byte-level (the offline default) or a Hugging Face tokenizer from a local folder."""

from __future__ import annotations

from pathlib import Path

from .corpus import PrepareError


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, nothing to download, exactly invertible."""

    name = "bytes"
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class HFTokenizer:
    """A `tokenizer.json` (Hugging Face `tokenizers`) read from a local folder, e.g. Qwen's."""

    def __init__(self, folder: str | Path):
        path = Path(folder) / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"no tokenizer.json in {folder} (give a Hugging Face tokenizer folder)")
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:  # pragma: no cover - tokenizers comes with transformers
            raise ImportError("reading a Hugging Face tokenizer needs the `tokenizers` package") from exc
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception for a file it cannot parse
            raise PrepareError(f"{path} is not a Hugging Face tokenizer ({exc})") from None
        self.name = str(Path(folder).resolve())
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids) -> str:
        return self._tok.decode([int(i) for i in ids])


def load_tokenizer(spec: str):
    """"bytes" or a folder holding a Hugging Face tokenizer.json."""
    if spec == "bytes":
        return ByteTokenizer()
    return HFTokenizer(spec)
