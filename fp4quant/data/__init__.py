"""Training data: a corpus tokenized into a memory-mapped token file, and deterministic batches.

`python -m fp4quant.data prepare` writes a prepared folder (tokens.bin + meta.json); the
default corpus, Shakespeare's works (public domain, see corpus/SOURCE.md), ships with the
package, so training runs offline anywhere.
"""

from .corpus import PrepareError
from .dataset import DataError, TokenDataset
from .prepare import DEFAULT_FOLDER, is_default_folder, prepare, prepare_default_once
from .tokenizer import ByteTokenizer, load_tokenizer

__all__ = ["DEFAULT_FOLDER", "ByteTokenizer", "DataError", "PrepareError", "TokenDataset", "is_default_folder",
           "load_tokenizer", "prepare", "prepare_default_once"]
