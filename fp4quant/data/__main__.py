"""`python -m fp4quant.data prepare [--input PATH ...] [--tokenizer bytes|DIR] [--out DIR]`."""

from __future__ import annotations

import argparse
import sys

from .prepare import DEFAULT_FOLDER, prepare


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fp4quant.data", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenize a corpus into a memory-mapped token file")
    p.add_argument("--out", default=DEFAULT_FOLDER, help="prepared folder to write")
    p.add_argument("--input", nargs="*", default=None,
                   help="text/JSONL files or folders (default: the bundled Shakespeare corpus)")
    p.add_argument("--tokenizer", default="bytes", help="'bytes' or a folder with a Hugging Face tokenizer.json")
    p.add_argument("--field", default="text", help="JSONL field holding the text")
    p.add_argument("--val-fraction", type=float, default=0.01)
    args = ap.parse_args(argv)
    meta = prepare(args.out, args.input, args.tokenizer, args.val_fraction, args.field)
    print(f"wrote {meta['n_tokens']} tokens ({meta['tokenizer']}, vocab {meta['vocab_size']}) to {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
