"""Training data: a corpus tokenized into a memory-mapped token file, and deterministic batches.

`python -m fp4quant.data prepare` writes a prepared folder (tokens.bin + meta.json); the
default corpus, Shakespeare's works (public domain, see corpus/SOURCE.md), ships with the
package, so training runs offline anywhere.
"""

from .dataset import TokenDataset
from .prepare import prepare
from .tokenizer import ByteTokenizer, load_tokenizer

__all__ = ["ByteTokenizer", "TokenDataset", "load_tokenizer", "prepare"]
