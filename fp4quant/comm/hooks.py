"""The one seam of the collectives: hooks called around a wire step and after a codec op.

None is installed by default, and then a collective pays one attribute read per call.  A
tool that must see or shape what the collectives do in this process installs an object
with these two methods (fp4quant.cluster's time dilation is one: it sleeps a dilated
latency before each wire step and stretches each codec op to a dilated target's time):

    on_wire(steps, intra_node)              before a collective's ``steps`` wire steps are
                                            issued, inside its communication timer;
                                            ``intra_node``: steps known to stay inside a
                                            node (False where the layout is unknown)
    on_codec(op, seconds, values, message_bytes)
                                            after a codec op ("quantize", "dequantize") that
                                            took ``seconds``, encoded or decoded ``values``
                                            values and wrote or read ``message_bytes`` bytes
                                            of messages; time it spends counts as the op's

The collectives know nothing of what a hook does; a hook changes time, never a value.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Protocol, runtime_checkable


@runtime_checkable
class Hooks(Protocol):
    def on_wire(self, steps: int, intra_node: bool) -> None: ...

    def on_codec(self, op: str, seconds: float, values: int, message_bytes: int) -> None: ...


class _Installed:
    """The process's installed hooks (at most one object: a tool that needs several composes them)."""

    def __init__(self) -> None:
        self.hooks: Hooks | None = None


_INSTALLED = _Installed()


def install(hooks: Hooks) -> None:
    """Install ``hooks`` for every collective of this process (one at a time)."""
    if not isinstance(hooks, Hooks):
        raise TypeError(f"hooks must have on_wire(steps, intra_node) and on_codec(op, seconds, values, message_bytes), "
                        f"got {type(hooks).__name__}")
    if _INSTALLED.hooks is not None and _INSTALLED.hooks is not hooks:
        raise RuntimeError(f"collective hooks are installed already ({type(_INSTALLED.hooks).__name__}): remove them "
                           "first")
    _INSTALLED.hooks = hooks


def remove() -> None:
    _INSTALLED.hooks = None


def installed() -> Hooks | None:
    return _INSTALLED.hooks


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No hooks inside the block (e.g. to time a collective without them), as they were after it."""
    saved, _INSTALLED.hooks = _INSTALLED.hooks, None
    try:
        yield
    finally:
        _INSTALLED.hooks = saved


def describe() -> dict | None:
    """What the installed hooks say of themselves (their ``describe()``), for a run's summary."""
    hooks = _INSTALLED.hooks
    if hooks is None:
        return None
    return hooks.describe() if hasattr(hooks, "describe") else {"kind": type(hooks).__name__}
