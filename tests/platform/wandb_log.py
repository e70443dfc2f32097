"""Read an offline W&B run back: its ``run-<id>.wandb`` file is a LevelDB-style log of W&B's protobuf
records (7-byte file header ``:W&B`` + magic 0xBEE1 + version; 32 KiB blocks of chunks, each with a
CRC32, a length and a type: full, first, middle, last). W&B 0.2x+ ships no reader of its own."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

HEADER = b":W&B" + struct.pack("<HB", 0xBEE1, 0)
BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of the log, parsed as ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[: len(HEADER)] == HEADER, "not a W&B transaction log"
    out, pos, pending = [], len(HEADER), b""
    while pos + 7 <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < 7:  # block trailer too short for a chunk header
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0 and length == 0:  # zero padding at the end
            pos += left_in_block
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
            pending = b""
    return out


def read_offline_run(run_dir: Path, settle_s: float = 30.0) -> dict[str, Any]:
    """``{"config": {...}, "history": [{"_step": s, key: value, ...}], "summary": {...}, "name": ...,
    "kinds": [the record types in file order]}`` (``kinds`` for the failure messages of the tests).

    Waits up to ``settle_s`` for the log's last record, ``exit``: W&B's writer (the wandb-core process) can still be
    flushing the log when ``run.finish()`` has returned -- a suite on torch 2.4.1 once read it with no record yet,
    and milliseconds later it was whole."""
    (log,) = Path(run_dir).glob("run-*.wandb")
    deadline = time.monotonic() + settle_s
    while time.monotonic() < deadline and not _ended(log):
        time.sleep(0.05)
    config: dict[str, Any] = {}
    history: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    name = None
    kinds = []
    for record in records(log):
        kind = record.WhichOneof("record_type")
        kinds.append(kind)
        if kind == "run":
            name = record.run.display_name
            config.update({i.key: json.loads(i.value_json) for i in record.run.config.update})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            history.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.summary.update})
    return {"name": name, "config": config, "history": history, "summary": summary, "kinds": kinds}


def _ended(log: Path) -> bool:
    """Whether the log holds its ``exit`` record (a log still being written may end in a partial record)."""
    try:
        return any(record.WhichOneof("record_type") == "exit" for record in records(log))
    except Exception:
        return False
