#!/usr/bin/env python3
"""Turns a text corpus that a Debian package ships into a belay tokens file: the GPT's
training and held-out text, byte-level, made offline (nothing downloaded).

The corpus: the .py sources of the Python standard library as Debian ships them in
libpython3.11-minimal and libpython3.11-stdlib (present wherever python3 3.11 is). The
file list is the packages' own (dpkg's md5sums), and every file taken is checked against
it: a file edited on this machine is refused, so one package version gives the same bytes
on every machine. Left out: links (conffiles under /etc) and _sysconfigdata_*.py (they
differ per architecture).

    python3 apps/data/make_text_corpus.py -o text.safetensors [--cap BYTES]

The file (docs/gpt-data.md): safetensors with two 1-D U8 tensors, `train` and `heldout`,
token = byte value (vocab 256), metadata naming the packages and versions, the file list's
hash, the split rule and the files of each split, and belay's CRC-32C checksums (its
reader verifies them). U8 because a byte token needs one byte: I64 would make the file
eight times larger for nothing. Python 3 standard library only."""
import argparse
import collections
import hashlib
import json
import math
import os
import struct
import subprocess
import sys

FORMAT = "belay.tokens.v1"
DEFAULT_CAP = 8 << 20  # bytes of source taken in all (train + held-out): about 80% of 3.11's


class CorpusError(Exception):
    pass


def dpkg_query(*args):
    try:
        return subprocess.run(["dpkg-query", *args], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        raise CorpusError("dpkg-query not found: the corpus is defined by Debian packages (a Debian or Ubuntu system)")
    except subprocess.CalledProcessError:
        return None


def package_files(package):
    """The package's version and {path: md5} of its files, from dpkg's own records."""
    status = dpkg_query("-W", "-f=${Status}\t${Version}", package)
    if not status or not status.startswith("install ok installed"):
        raise CorpusError(f"package {package} is not installed: apt-get install {package} "
                          "(third_party/install_deps.sh does)")
    version = status.split("\t")[1]
    md5_path = (dpkg_query("--control-path", package, "md5sums") or "").strip()
    if not md5_path:
        raise CorpusError(f"dpkg has no md5sums for {package}: reinstall it (apt-get install --reinstall {package})")
    files = {}
    with open(md5_path, encoding="utf-8") as f:
        for line in f:
            md5, path = line.rstrip("\n").split("  ", 1)
            files["/" + path] = md5
    return version, files


def corpus_files(python):
    """(packages with versions, sorted [(path under the root, md5)]) of the corpus."""
    root = f"/usr/lib/python{python}/"
    packages, files = [], []
    for package in (f"libpython{python}-minimal", f"libpython{python}-stdlib"):
        version, listed = package_files(package)
        packages.append(f"{package}={version}")
        for path, md5 in listed.items():
            rel = path[len(root):]
            if (path.startswith(root) and path.endswith(".py") and not os.path.islink(path)
                    and not os.path.basename(rel).startswith("_sysconfigdata_")):
                files.append((rel, md5))
    if not files:
        raise CorpusError(f"the packages list no .py files under {root}")
    return packages, root, sorted(files)


def read_checked(root, rel, md5):
    with open(root + rel, "rb") as f:
        data = f.read()
    if hashlib.md5(data, usedforsecurity=False).hexdigest() != md5:
        raise CorpusError(f"{root + rel} differs from its package's copy (dpkg md5sums): "
                          "reinstall the package, or the corpus would differ from every other machine's")
    return data


def split_files(root, files, cap, heldout_every):
    """Files in the order of the sha256 of their path (a fixed shuffle, so any cap takes a
    sample of the whole library, not its first letters); a file that would pass the cap is
    skipped; of the files taken, every heldout_every-th (the last of each run of that many)
    is held out, the others are for training. No file is in both splits."""
    order = sorted(files, key=lambda f: hashlib.sha256(f[0].encode()).hexdigest())
    splits = {"train": ([], []), "heldout": ([], [])}  # names, contents
    taken_bytes = taken_files = 0
    for rel, md5 in order:
        size = os.path.getsize(root + rel)
        if size == 0 or taken_bytes + size > cap:
            continue
        data = read_checked(root, rel, md5)
        taken_bytes += len(data)
        taken_files += 1
        to = "heldout" if taken_files % heldout_every == 0 else "train"
        splits[to][0].append(rel)
        splits[to][1].append(data)
    return {k: (names, b"".join(parts)) for k, (names, parts) in splits.items()}


def unigram_entropy_bits(data):
    n = len(data)
    return -sum(c / n * math.log2(c / n) for c in collections.Counter(data).values())


def unigram_cross_entropy_bits(train, held):
    """Bits per byte a unigram model fitted on train (add-one smoothed over the 256 bytes, so
    a byte train lacks costs finitely) spends on held: what a model that ignores context gets
    on the held-out split."""
    counts, total = collections.Counter(train), len(train) + 256
    return -sum(c * math.log2((counts[b] + 1) / total) for b, c in collections.Counter(held).items()) / len(held)


def crc32c_tables():
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        t0.append(c)
    tables = [t0]
    for _ in range(7):
        tables.append([(p >> 8) ^ t0[p & 0xFF] for p in tables[-1]])
    return tables


def crc32c(data):
    """CRC-32C (Castagnoli), as engine/safetensors.cpp checks it; eight bytes a step."""
    t0, t1, t2, t3, t4, t5, t6, t7 = crc32c_tables()
    crc = 0xFFFFFFFF
    whole = len(data) // 8 * 8
    for (w,) in struct.iter_unpack("<Q", memoryview(data)[:whole]):
        x, hi = crc ^ (w & 0xFFFFFFFF), w >> 32
        crc = (t7[x & 0xFF] ^ t6[(x >> 8) & 0xFF] ^ t5[(x >> 16) & 0xFF] ^ t4[x >> 24] ^
               t3[hi & 0xFF] ^ t2[(hi >> 8) & 0xFF] ^ t1[(hi >> 16) & 0xFF] ^ t0[hi >> 24])
    for b in data[whole:]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def write_safetensors(path, tensors, metadata):
    """U8 1-D tensors in the given order, with belay's two checksums: the data's CRC-32C and
    the header's (as nlohmann::json dumps it: sorted keys, no whitespace, without the two
    checksum keys). Written to a temporary file and renamed over `path`."""
    header, at = {}, 0
    for name, data in tensors:
        header[name] = {"dtype": "U8", "shape": [len(data)], "data_offsets": [at, at + len(data)]}
        at += len(data)
    header["__metadata__"] = dict(metadata)
    canonical = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    header["__metadata__"]["belay.header_checksum"] = f"crc32c:{crc32c(canonical.encode()):08x}"
    header["__metadata__"]["belay.checksum"] = f"crc32c:{crc32c(b''.join(d for _, d in tensors)):08x}"
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(text)) + text)
            for _, data in tensors:
                f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-o", "--output", required=True, help="the tokens file to write (.safetensors)")
    p.add_argument("--cap", type=int, default=DEFAULT_CAP, help=f"bytes of source in all (default {DEFAULT_CAP})")
    p.add_argument("--heldout-every", type=int, default=10, help="hold out every Nth file taken (default 10)")
    p.add_argument("--python", default="3.11", help="whose standard library (default 3.11)")
    a = p.parse_args()
    if a.cap < 1 or a.heldout_every < 2:
        p.error("--cap must be >= 1 and --heldout-every >= 2")
    try:
        packages, root, files = corpus_files(a.python)
        splits = split_files(root, files, a.cap, a.heldout_every)
    except (CorpusError, OSError) as e:
        print(f"make_text_corpus: error: {e}", file=sys.stderr)
        return 1
    (train_names, train), (held_names, held) = splits["train"], splits["heldout"]
    if not train or not held:
        print(f"make_text_corpus: error: --cap {a.cap} leaves a split empty; give a larger cap", file=sys.stderr)
        return 1
    bits, held_bits = unigram_entropy_bits(train), unigram_cross_entropy_bits(train, held)
    listing = "".join(f"{md5}  {rel}\n" for rel, md5 in files).encode()
    meta = {
        "tokens.format": FORMAT,
        "tokens.vocab": "256",
        "tokens.kind": "bytes: token i is the byte i of the sources as shipped (UTF-8)",
        "corpus.name": f"Python {a.python} standard library, .py sources",
        "corpus.packages": " ".join(packages),
        "corpus.root": root,
        "corpus.files": str(len(files)),
        "corpus.file_list_sha256": hashlib.sha256(listing).hexdigest(),
        "corpus.cap_bytes": str(a.cap),
        "split.rule": " ".join(split_files.__doc__.split()),
        "split.heldout_every": str(a.heldout_every),
        "train.files": "\n".join(train_names),
        "heldout.files": "\n".join(held_names),
        "train.tokens": str(len(train)),
        "heldout.tokens": str(len(held)),
        "train.unigram_entropy_bits_per_byte": repr(bits),
        "heldout.unigram_cross_entropy_bits_per_byte": repr(held_bits),
        "made_by": "apps/data/make_text_corpus.py",
    }
    write_safetensors(a.output, [("train", train), ("heldout", held)], meta)
    print(f"corpus: {' '.join(packages)}: {len(files)} .py files, list sha256 {meta['corpus.file_list_sha256'][:16]}")
    print(f"train: {len(train_names)} files, {len(train)} tokens")
    print(f"heldout: {len(held_names)} files, {len(held)} tokens")
    print(f"train unigram entropy: {bits:.4f} bits per byte ({bits * math.log(2):.4f} nats)")
    print(f"heldout under the train unigram: {held_bits:.4f} bits per byte ({held_bits * math.log(2):.4f} nats)")
    print(f"wrote {a.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
