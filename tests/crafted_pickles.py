"""Hostile files as an attacker would plant them: pickles built opcode by opcode, and torch files around them.

Each payload, if unpickled, runs `touch <marker>`; a test asserts that the marker file was never created.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import zipfile
from pathlib import Path

import torch


def _unicode(text: str) -> bytes:
    data = text.encode("utf-8")
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def global_call(module: str, name: str, argument: str) -> bytes:
    """A protocol-4 pickle (where dotted names resolve attribute by attribute): GLOBAL module name, then REDUCE it
    on (argument,): `module.name(argument)`."""
    return (
        pickle.PROTO
        + b"\x04"
        + pickle.GLOBAL
        + f"{module}\n{name}\n".encode()
        + _unicode(argument)
        + pickle.TUPLE1
        + pickle.REDUCE
        + pickle.STOP
    )


def prefix_trick(marker: Path) -> bytes:
    """The pickle the issue names: GLOBAL 'torch.nn.modules.module' 'torch.serialization.os.system'. Its module
    starts like a torch layer's, and `getattr` through the dotted name reaches os.system."""
    return global_call("torch.nn.modules.module", "torch.serialization.os.system", f"touch {marker}")


class Payload:
    """An object whose unpickling runs a shell command (its __reduce__ names os.system)."""

    def __init__(self, marker: Path) -> None:
        self.command = f"touch {marker}"

    def __reduce__(self) -> tuple:
        return (os.system, (self.command,))


def in_torch_zip(pickled: bytes) -> bytes:
    """A file in torch.save's zip format whose data.pkl is `pickled` (torch.load reads it as any other)."""
    buffer = io.BytesIO()
    torch.save({"x": torch.zeros(1)}, buffer)
    source = zipfile.ZipFile(io.BytesIO(buffer.getvalue()))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as target:
        for item in source.infolist():
            data = pickled if item.filename.endswith("/data.pkl") else source.read(item)
            target.writestr(item, data)
    return out.getvalue()


def checkpoint_with_payload(marker: Path) -> dict:
    """A state with every key a training checkpoint has, and a payload in its history."""
    return {
        "model": {},
        "optimizer": {},
        "epoch": 1,
        "iteration": 1,
        "seed": 0,
        "history": [Payload(marker)],
        "best": {},
        "rng": torch.get_rng_state(),
        "options": {},
        "samples": 1,
    }
