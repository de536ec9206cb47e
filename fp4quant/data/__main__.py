"""`python -m fp4quant.data prepare [--input PATH ...] [--tokenizer bytes|DIR] [--out DIR]`.

Bad input (a missing or non-text file, an unusable tokenizer, an unwritable --out, unknown
options) is one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys

from .corpus import PrepareError
from .prepare import DEFAULT_FOLDER, prepare

PROG = "fp4quant.data"


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own prints the usage first: several lines where one is promised
        sys.exit(fail(f"{message} (see `python -m {PROG} prepare --help`)"))


def fail(message: str) -> int:
    message = " ".join(message.splitlines())  # a library's message may span lines
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return 2


def describe(exc: OSError) -> str:
    """One line for an OSError: its own message, with the file it concerns when it names one."""
    if exc.strerror is None:  # raised with a message of ours
        return str(exc)
    return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror


def main(argv=None) -> int:
    ap = _Parser(prog=f"python -m {PROG}", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("prepare", help="tokenize a corpus into a memory-mapped token file")
    p.add_argument("--out", default=DEFAULT_FOLDER, help="prepared folder to write")
    p.add_argument("--input", nargs="+", default=None,
                   help="text/JSONL files or folders (default: the bundled Shakespeare corpus)")
    p.add_argument("--tokenizer", default="bytes", help="'bytes' or a folder with a Hugging Face tokenizer.json")
    p.add_argument("--field", default="text", help="JSONL field holding the text")
    p.add_argument("--val-fraction", type=float, default=0.01)
    args = ap.parse_args(argv)
    if not args.out:  # Path("") is the working directory
        return fail("--out must name a folder")
    try:
        meta = prepare(args.out, args.input, args.tokenizer, args.val_fraction, args.field)
    except PrepareError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(describe(exc))
    print(f"wrote {meta['n_tokens']} tokens ({meta['tokenizer']}, vocab {meta['vocab_size']}) to {args.out}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
