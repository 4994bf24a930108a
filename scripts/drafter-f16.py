#!/usr/bin/env python3
"""Copy a DSpark drafter folder with its f32 weights stored as f16 (half the bytes).

    scripts/drafter-f16.py SRC DST

Every `model*.safetensors` shard of SRC is rewritten into DST with each F32 tensor
rounded to the nearest f16 (ties to even, Python's `struct` 'e' format); other dtypes are
copied as they are. `dspark.json`, `model.safetensors.index.json` and any other file are
copied unchanged (the shard names stay). tandem widens f16 weights back to f32 on load.
Fails when a weight is outside f16's finite range. Standard library only.
"""
import json
import math
import shutil
import struct
import sys
from pathlib import Path


def convert(src: Path, dst: Path) -> None:
    raw = src.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    body = raw[8 + n :]
    meta = header.pop("__metadata__", None)
    out_header, chunks, offset = {}, [], 0
    for name in sorted(header, key=lambda k: header[k]["data_offsets"][0]):
        t = header[name]
        start, end = t["data_offsets"]
        data = body[start:end]
        if t["dtype"] == "F32":
            count = len(data) // 4
            values = struct.unpack(f"<{count}f", data)
            bad = next((v for v in values if not math.isfinite(v) or abs(v) > 65504), None)
            if bad is not None:
                sys.exit(f"drafter-f16: {src}: {name} holds {bad}, outside f16's range")
            data = struct.pack(f"<{count}e", *values)
            t = dict(t, dtype="F16")
        out_header[name] = dict(t, data_offsets=[offset, offset + len(data)])
        chunks.append(data)
        offset += len(data)
    if meta is not None:
        out_header["__metadata__"] = meta
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    dst.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def main() -> None:
    if len(sys.argv) != 3:
        sys.exit("usage: drafter-f16.py SRC DST")
    src, dst = Path(sys.argv[1]), Path(sys.argv[2])
    if not (src / "dspark.json").is_file():
        sys.exit(f"drafter-f16: {src} has no dspark.json")
    dst.mkdir(parents=True, exist_ok=True)
    for f in sorted(src.iterdir()):
        if f.name.startswith("model") and f.suffix == ".safetensors":
            convert(f, dst / f.name)
        elif f.is_file() and f.name in ("dspark.json", "model.safetensors.index.json"):
            shutil.copyfile(f, dst / f.name)


if __name__ == "__main__":
    main()
