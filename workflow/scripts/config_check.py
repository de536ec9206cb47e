"""The workflow's configuration, checked before any rule runs: one line naming the key.

The Snakefile calls ``check(config, schema)``; a ``ConfigError`` becomes

    config error: train.stpes is not a known key (did you mean steps?)

instead of Snakemake's dump of the whole schema.  First the schema
(workflow/schemas/config.schema.yaml), then what a schema cannot say: the TP communication
presets the code defines (fp4quant.format.PRESETS, plus "exact"; "<preset>@fwd" or "@bwd"
compresses one direction), the presets the collective benchmark measures, the study's
batches, how the ranks of a training run split over the emulated nodes or the
launcher's nodes, and that tests.args splits into words.
"""

from __future__ import annotations

import difflib
import shlex
from typing import Any

import jsonschema

from fp4quant.bench.allreduce_sweep import PRESETS as BENCH_PRESETS
from fp4quant.format import PRESETS
from fp4quant.train.train_config import ConfigError as TrainConfigError
from fp4quant.train.train_config import parse_run_name

TRAIN_COMMS = (*PRESETS, "exact")  # what `python -m fp4quant.train --comm` accepts
TYPE_NAMES = {"integer": "an integer", "number": "a number", "string": "a string", "boolean": "true or false",
              "array": "a list", "object": "a mapping"}


class ConfigError(ValueError):
    """A configuration the workflow cannot run, in one line naming the key."""


def check(config: dict[str, Any], schema: dict[str, Any]) -> None:
    """Raise ConfigError for the first problem of ``config`` (nothing: it can run)."""
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(config))
    if errors:
        # a misspelt key explains the required key it leaves missing: report it first, deepest first
        first = min(errors, key=lambda e: (e.validator != "additionalProperties", -len(e.absolute_path)))
        raise ConfigError(describe(first))
    check_presets(config)
    check_study(config)
    check_ranks(config)
    check_test_args(config)


def key(path, *more) -> str:
    """``train.comms[1]`` for the path ('train', 'comms', 1)."""
    out = ""
    for part in (*path, *more):
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "the configuration"


def did_you_mean(word: str, known) -> str:
    match = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.6)
    return f" (did you mean {match[0]}?)" if match else f" (known: {', '.join(map(str, known))})"


def describe(e: jsonschema.ValidationError) -> str:
    """One line for one schema violation."""
    path, v, got = e.absolute_path, e.validator_value, e.instance
    if e.validator == "additionalProperties":
        known = list(e.schema.get("properties", {}))
        extra = sorted(k for k in got if k not in known)[0]
        return f"{key(path, extra)} is not a known key" + did_you_mean(extra, known)
    if e.validator == "required":
        return f"{key(path, next(k for k in v if k not in got))} is missing (required)"
    if e.validator == "type":
        return f"{key(path)} must be {TYPE_NAMES.get(v, v)}, got {got!r}"
    if e.validator == "enum":
        return f"{key(path)} must be one of {', '.join(map(str, v))}, got {got!r}"
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if e.validator in bounds:
        return f"{key(path)} must be {bounds[e.validator]} {v}, got {got!r}"
    if e.validator == "minItems":
        return f"{key(path)} must list at least {v} item{'s' if v != 1 else ''}, got {got!r}"
    if e.validator == "pattern":
        return f"{key(path)} must match {v}, got {got!r}"
    return f"{key(path)}: {' '.join(e.message.split())}"


def check_presets(config: dict[str, Any]) -> None:
    for i, comm in enumerate(config["train"]["comms"]):
        if "+" in comm:
            raise ConfigError(f"train.comms[{i}]: {comm!r}: the compute is train.computes, not part of a comm")
        preset = comm.split("@")[0]
        if preset not in TRAIN_COMMS:
            raise ConfigError(f"train.comms[{i}]: {preset!r} is not a TP communication preset"
                              + did_you_mean(preset, TRAIN_COMMS))
        try:  # "<preset>@<directions>": only a compressed preset has directions to leave out
            parse_run_name(comm)
        except TrainConfigError as exc:
            raise ConfigError(f"train.comms[{i}]: {exc}") from None
    cluster = config.get("cluster", {})
    if cluster.get("enabled", False):
        if "throughput" not in cluster:
            raise ConfigError("cluster.throughput is missing (required where cluster.enabled is true: "
                              "the throughput runs on the emulated cluster)")
        run = cluster["throughput"]
        if run["warmup_steps"] >= run["steps"]:
            raise ConfigError(f"cluster.throughput.warmup_steps: {run['warmup_steps']} leaves none of the "
                              f"{run['steps']} steps to measure")
        validation = cluster.get("validation", {}).get("comms", [])
        for where, comms in (("throughput", run["comms"]), ("validation", validation)):
            for i, comm in enumerate(comms):
                if comm not in TRAIN_COMMS:
                    raise ConfigError(f"cluster.{where}.comms[{i}]: {comm!r} is not a TP communication preset"
                                      + did_you_mean(comm, TRAIN_COMMS))
    for i, preset in enumerate(config["bench"].get("collective_presets", [])):
        if preset not in BENCH_PRESETS:
            raise ConfigError(f"bench.collective_presets[{i}]: the collective benchmark does not measure {preset!r}"
                              + did_you_mean(preset, BENCH_PRESETS))


def check_study(config: dict[str, Any]) -> None:
    """Each of the study's batches lists comms the configuration trains, none twice."""
    seen: dict[str, str] = {}
    for b, batch in enumerate(config.get("study", {}).get("batches", [])):
        for i, comm in enumerate(batch):
            where = f"study.batches[{b}][{i}]"
            if comm not in config["train"]["comms"]:
                raise ConfigError(f"{where}: {comm!r} is not in train.comms" + did_you_mean(comm, config["train"]["comms"]))
            if comm in seen:
                raise ConfigError(f"{where}: {comm!r} is already in {seen[comm]}")
            seen[comm] = where


def check_ranks(config: dict[str, Any]) -> None:
    """The training run's TP ranks split evenly over the emulated nodes, or the launcher's ranks
    hold whole TP groups."""
    tp = config["train"]["tp"]
    cluster = config.get("cluster", {})
    if cluster.get("enabled", False):
        nodes = cluster.get("nodes", 2)
        if tp % nodes:
            raise ConfigError(f"cluster.nodes: {nodes} does not divide train.tp: {tp} "
                              "(each emulated node runs tp / nodes ranks of the TP group)")
        return
    launcher = config["launcher"]
    if launcher["kind"] == "nodelist" and not launcher.get("nodes"):
        raise ConfigError("launcher.nodes must list the hosts to run on (launcher.kind is nodelist)")
    nnodes = len(launcher.get("nodes", [])) if launcher["kind"] == "nodelist" else launcher.get("nnodes", 1)
    world = nnodes * launcher["nproc_per_node"]
    if world % tp:
        raise ConfigError(f"train.tp: {tp} does not divide the launcher's {world} ranks "
                          f"({nnodes} node(s) x launcher.nproc_per_node {launcher['nproc_per_node']})")


def check_test_args(config: dict[str, Any]) -> None:
    """tests.args splits into words as a shell would split it (the test rule quotes each word)."""
    try:
        shlex.split(config.get("tests", {}).get("args", ""))
    except ValueError as exc:
        raise ConfigError(f"tests.args: {exc} in {config['tests']['args']!r}") from None
