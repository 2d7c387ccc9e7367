#!/usr/bin/env python3
"""Reads a safetensors file that belay wrote (tests/engine/write_sample_safetensors.cpp)
with the Python standard library alone, as any other reader of the format would, and
checks the layout, belay's two CRC-32C checksums and the tensor bytes against values
computed here. Exit 0 when all holds, 1 with the reasons otherwise."""
import json
import struct
import sys

VALUES = [1.0, -2.5, 0.15625, 1024.0, -0.0, 3.0]
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def bf16(v: float) -> bytes:  # exact values only: the top half of the float32
    return struct.pack("<f", v)[2:]


EXPECTED = {
    "weight": ("F32", [2, 3], b"".join(struct.pack("<f", v) for v in VALUES)),
    "weight_f16": ("F16", [3, 2], b"".join(struct.pack("<e", v) for v in VALUES)),
    "weight_bf16": ("BF16", [6], b"".join(bf16(v) for v in VALUES)),
    "scalar": ("F32", [], struct.pack("<f", 7.0)),
    "empty": ("F16", [0, 4], b""),
    "labels": ("I64", [5], struct.pack("<5q", 0, 1, -1, 1 << 40, -(1 << 63))),
}
METADATA = {"belay.sample": "1", "step": "42", "note": 'h\u00e9llo "quoted"\n'}


def check(path: str) -> list:
    errors = []
    blob = open(path, "rb").read()
    if len(blob) < 8:
        return [f"file is {len(blob)} bytes"]
    (n,) = struct.unpack("<Q", blob[:8])
    if n % 8 != 0:
        errors.append(f"header length {n} is not a multiple of 8")
    if 8 + n > len(blob):
        return errors + [f"header length {n} runs past the file ({len(blob)} bytes)"]
    raw = blob[8:8 + n]
    text = raw.decode("utf-8")
    stripped = text.rstrip(" ")
    if not stripped.startswith("{") or not stripped.endswith("}"):
        errors.append("header is not one JSON object padded with spaces")
    header = json.loads(text)
    data = blob[8 + n:]

    meta = header.pop("__metadata__", {})
    for key, value in METADATA.items():
        if meta.get(key) != value:
            errors.append(f"metadata {key!r} is {meta.get(key)!r}, expected {value!r}")
    data_sum, header_sum = meta.get("belay.checksum"), meta.get("belay.header_checksum")
    if data_sum != f"crc32c:{crc32c(data):08x}":
        errors.append(f"belay.checksum is {data_sum!r}, computed crc32c:{crc32c(data):08x}")
    # The header checksum covers the header with both checksum keys removed, dumped with
    # sorted keys and no whitespace.
    canonical = dict(header)
    canonical["__metadata__"] = {k: v for k, v in meta.items()
                                 if k not in ("belay.checksum", "belay.header_checksum")}
    dumped = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    computed = f"crc32c:{crc32c(dumped.encode('utf-8')):08x}"
    if header_sum != computed:
        errors.append(f"belay.header_checksum is {header_sum!r}, computed {computed}")

    if set(header) != set(EXPECTED):
        errors.append(f"tensors are {sorted(header)}, expected {sorted(EXPECTED)}")
    at = 0
    for name, info in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, end = info["data_offsets"]
        if begin != at:
            errors.append(f"{name}: begins at {begin}, the previous tensor ended at {at}")
        at = end
        count = 1
        for d in info["shape"]:
            count *= d
        if end - begin != count * SIZES[info["dtype"]]:
            errors.append(f"{name}: {end - begin} bytes for shape {info['shape']} of {info['dtype']}")
        if begin % SIZES[info["dtype"]] != 0:
            errors.append(f"{name}: offset {begin} is not aligned to its element size")
        if name in EXPECTED:
            dtype, shape, payload = EXPECTED[name]
            if (info["dtype"], info["shape"]) != (dtype, shape):
                errors.append(f"{name}: {info['dtype']} {info['shape']}, expected {dtype} {shape}")
            if data[begin:end] != payload:
                errors.append(f"{name}: bytes {data[begin:end].hex()} expected {payload.hex()}")
    if at != len(data):
        errors.append(f"tensors cover {at} bytes of a {len(data)}-byte data section")
    return errors


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: safetensors_independent_check.py FILE.safetensors", file=sys.stderr)
        return 2
    errors = check(sys.argv[1])
    for e in errors:
        print(f"safetensors_independent_check: {e}", file=sys.stderr)
    if not errors:
        print(f"safetensors_independent_check: {sys.argv[1]} reads correctly")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
