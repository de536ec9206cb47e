"""Train a tensor-parallel Qwen2 with compressed TP communication, under torchrun or simulated:

    torchrun --nproc-per-node 2 -m fp4quant.train --model tiny --tp 2 --comm fp4quant --steps 300 --out data/runs/NAME
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-endpoint HOST:29500 -m fp4quant.train --model qwen-7b --tp 16 ...
    python -m fp4quant.train --model small --tp 16 --simulate-tp ...   # 16 ranks as threads of one process

Writes NAME/log.jsonl (one line per step, rank 0), NAME/checkpoints/ (resumed from
automatically, with the log up to their step), NAME/summary.json (provenance and headline
figures).  A bad configuration, damaged data, an unwritable --out fail on every rank with
one line before any process group is created; a checkpoint of another configuration,
ranks started differently, or a run folder in use by another run, with one line right
after; a full disk or another failing write, with one line when it happens.  Exit status:
2 for those, 1 only when the loss became non-finite.  Under torchrun the line is also the
worker's error file, so the launcher's failure report names it, and each worker dies with
torchrun.  The default --data (the bundled corpus) is prepared on first use.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from ..data import DataError, TokenDataset, is_default_folder, prepare_default_once
from .train_config import ConfigError, TrainConfig, world_from_env
from .ownership import die_with_launcher



class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, as every other refusal (argparse prints its usage too)
        raise ConfigError(message)


def parse(argv=None) -> TrainConfig:
    ap = _Parser(prog="python -m fp4quant.train", description=__doc__,
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):  # --x / --no-x
            ap.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
        elif f.name == "out":
            ap.add_argument(flag, required=True, help="run folder (log.jsonl, checkpoints/, summary.json)")
        else:
            ap.add_argument(flag, type=int if f.default is None else type(f.default), default=f.default)
    args = ap.parse_args(argv)
    return TrainConfig(**vars(args))


def fail(exc: Exception, status: int) -> int:
    """Report ``exc`` in one line on stderr and, under torchrun, in this worker's error file."""
    message = f"fp4quant.train: error: {exc}"
    # one write of the whole line: the ranks under torchrun share one stderr pipe, and print()
    # writes the text and its newline apart, so two ranks' lines could run into one
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    if os.environ.get("TORCHELASTIC_ERROR_FILE"):  # the format torch.distributed.elastic reads back
        record = {"message": {"message": message,
                              "extraInfo": {"py_callstack": message, "timestamp": str(int(time.time()))}}}
        with contextlib.suppress(OSError):  # the line on stderr is what matters
            Path(os.environ["TORCHELASTIC_ERROR_FILE"]).write_text(json.dumps(record))
    return status


def main(argv=None) -> int:
    die_with_launcher()
    try:
        cfg = parse(argv)
        world = world_from_env()
        cfg.check_out()
        if is_default_folder(cfg.data):
            try:
                prepare_default_once(cfg.data)
            except OSError as exc:
                raise ConfigError(f"cannot prepare the bundled corpus into {cfg.data} ({exc.strerror or exc})") from None
        data = TokenDataset(cfg.data) if Path(cfg.data, "meta.json").exists() else None
        cfg.check_world(world, data.vocab_size if data else None)
        if data is not None:  # every rank reaches the same verdict: they fail together, before any group exists
            data.require_windows(cfg.seq_len, "train")
    except (ConfigError, DataError) as exc:
        return fail(exc, 2)
    import torch
    import torch.distributed as dist

    from .loop import Trainer, TrainingDiverged

    if "RANK" in os.environ:
        use_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
        dist.init_process_group(cfg.backend if cfg.backend != "auto" else "nccl" if use_cuda else "gloo")
    try:
        if cfg.simulate_tp:
            from .simulate import run

            summary = run(cfg, data)
        else:
            summary = Trainer(cfg, data).run()
    except ConfigError as exc:  # ranks that disagree, a checkpoint of another configuration
        return fail(exc, 2)
    except OSError as exc:  # the environment's: a full disk, a folder made read-only under the run
        where = exc.filename or f"the run folder {cfg.out}"
        return fail(f"cannot write {where}: {exc.strerror or exc}", 2)
    except TrainingDiverged as exc:
        return fail(exc, 1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if summary.get("final_loss") is not None and int(os.environ.get("RANK", "0")) == 0:
        print(f"final loss {summary['final_loss']:.4f}, {summary['tokens_per_s']:.0f} tokens/s -> {cfg.out}",
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
