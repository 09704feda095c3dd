#!/usr/bin/python3
"""Builds a deterministic byte corpus for the trainer from the Linux kernel sources.

usage:
  prepare_corpus.py linux [--source TARBALL] [--out DIR] [--exclude PATH]... [--max-bytes N] [--pack]
  prepare_corpus.py unpack DIR

`linux` reads Debian's linux-source tarball (apt-get install linux-source-6.1, which puts it at
/usr/src/linux-source-6.1.tar.xz) as a stream, without extracting it, and writes DIR/train.txt,
DIR/val.txt and DIR/manifest.json:
- files: regular members whose path below the archive's top directory ends in .c or .h, or lies
  under Documentation/ and ends in .rst or .txt; a file holding a NUL byte or not valid UTF-8 is
  skipped (the manifest lists it), as is a path that is not UTF-8 or holds a control character;
- --exclude PATH (repeatable) drops the file PATH or every file under the directory PATH;
- order: sorted by that path (its UTF-8 bytes);
- each file is written as the line "### file: <path>" followed by its bytes, plus a newline
  where the file does not end in one;
- split: a file goes to val.txt when the first 8 bytes of SHA-256(path), big-endian, mod 100
  are < 1 (about 1% of the files), otherwise to train.txt;
- --max-bytes N keeps the longest prefix of that order whose records (train and val together)
  fit in N bytes; --pack also writes train.txt.xz and val.txt.xz for the GPU machine, where
  `unpack DIR` restores the .txt files and checks them against the manifest's SHA-256.
Only the standard library is used. Outputs appear whole or not at all (temporary file, fsync,
rename); a bad argument, a missing or unreadable tarball or an unwritable DIR exit with status 2.
"""
import argparse
import glob
import hashlib
import json
import lzma
import os
import signal
import sys
import tarfile
import time

SEPARATOR = b"### file: "
VAL_PERCENT = 1
XZ_PRESET = 9  # the 64 MiB that travel to the GPU machine: ratio matters more than time
OUTPUTS = ("train", "val")
RULES = {
    "select": "regular files whose path below the archive's top directory ends in .c or .h, "
              "or lies under Documentation/ and ends in .rst or .txt",
    "skip": "files holding a NUL byte (binary) or not valid UTF-8; paths that are not UTF-8 "
            "or hold a control character",
    "order": "sorted by path (UTF-8 bytes)",
    "record": "the line '### file: <path>', then the file's bytes, then a newline if the file "
              "does not end in one",
    "split": "val when int.from_bytes(sha256(path)[:8], 'big') % 100 < 1, else train",
    "exclude": "files at or under each --exclude path are left out",
    "max_bytes": "the longest prefix of the order whose records (train and val together) fit",
}


class CorpusError(Exception):
    """A clear, user-facing error: printed as 'error: ...' with exit status 2."""


def is_val(path):
    digest = hashlib.sha256(path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % 100 < VAL_PERCENT


def selected(path):
    if path.endswith((".c", ".h")):
        return True
    return path.startswith("Documentation/") and path.endswith((".rst", ".txt"))


def usable_name(path):
    try:
        path.encode("utf-8")  # tarfile keeps undecodable bytes as surrogates
    except UnicodeEncodeError:
        return False
    return not any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in path)


def record_parts(path, data):
    tail = b"\n" if data and not data.endswith(b"\n") else b""
    return (SEPARATOR + path.encode("utf-8") + b"\n", data, tail)


def default_source():
    found = sorted(glob.glob("/usr/src/linux-source-*.tar.xz"))
    if not found:
        raise CorpusError("--source: no /usr/src/linux-source-*.tar.xz; install one "
                          "(apt-get install linux-source-6.1) or pass --source TARBALL")
    if len(found) > 1:
        raise CorpusError("--source: several tarballs in /usr/src (" + ", ".join(found) +
                          "); pass --source TARBALL")
    return found[0]


def check_source(source):
    if not os.path.exists(source):
        raise CorpusError(f"--source: '{source}' does not exist")
    if not os.path.isfile(source):
        raise CorpusError(f"--source: '{source}' is not a regular file")
    h = hashlib.sha256()
    size = 0
    try:
        with open(source, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                size += len(chunk)
    except OSError as e:
        raise CorpusError(f"--source: cannot read '{source}': {e.strerror or e}") from None
    return {"name": os.path.basename(source), "bytes": size, "sha256": h.hexdigest()}


def read_archive(source):
    """Streams the tarball once; returns (root, {path in archive: bytes} for candidate names,
    counts). Candidates are kept in memory because the archive's order is not the corpus's."""
    members = {}
    tops = set()
    top_level_file = False
    counts = {"members": 0, "regular": 0, "not_regular": 0}
    try:
        with tarfile.open(source, mode="r|*") as tar:
            for m in tar:
                counts["members"] += 1
                name = m.name
                while name.startswith("./"):
                    name = name[2:]
                parts = name.split("/", 1)
                tops.add(parts[0])
                if len(parts) == 1 and not m.isdir():
                    top_level_file = True
                if m.isdir():
                    continue
                if not m.isreg():
                    counts["not_regular"] += 1
                    continue
                counts["regular"] += 1
                if name.endswith((".c", ".h", ".rst", ".txt")):
                    members[name] = tar.extractfile(m).read()  # a repeated name: the last wins, as tar does
    except (tarfile.TarError, lzma.LZMAError, EOFError, OSError, ValueError) as e:
        raise CorpusError(f"--source: cannot read '{source}' as a tar archive: {e}") from None
    if counts["members"] == 0:
        raise CorpusError(f"--source: '{source}' is an empty archive")
    root = tops.pop() + "/" if len(tops) == 1 and not top_level_file else ""
    return root, members, counts


def excluded(path, exclude):
    return any(path == e or path.startswith(e + "/") for e in exclude)


def select_files(root, members, max_bytes, exclude=()):
    """Applies the rules: returns the kept (record parts, is_val) in order and the manifest's
    account of what was left out."""
    skipped = {"binary": [], "not_utf8": [], "bad_name": []}
    files = []
    n_excluded = 0
    for name, data in members.items():
        path = name[len(root):]
        if not selected(path):
            continue
        if excluded(path, exclude):
            n_excluded += 1
            continue
        if not usable_name(path):
            skipped["bad_name"].append(path.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))
            continue
        if b"\0" in data:
            skipped["binary"].append(path)
            continue
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            skipped["not_utf8"].append(path)
            continue
        files.append((path.encode("utf-8"), path, data))
    files.sort(key=lambda t: t[0])
    kept = []
    total = 0
    for _, path, data in files:
        parts = record_parts(path, data)
        size = sum(map(len, parts))
        if max_bytes is not None and total + size > max_bytes:
            break
        total += size
        kept.append((parts, is_val(path)))
    for v in skipped.values():
        v.sort()
    return kept, len(files) - len(kept), n_excluded, skipped


class AtomicOutputs:
    """Temporary files in the output directory, published by rename only when all are written."""

    def __init__(self, out_dir, names, what="--out"):
        self.out_dir = out_dir
        self.tmp = {n: os.path.join(out_dir, f".{n}.tmp.{os.getpid()}") for n in names}
        self.files = {}
        try:
            for n, p in self.tmp.items():
                self.files[n] = open(p, "wb")
        except OSError as e:
            self.discard()
            raise CorpusError(f"{what}: cannot write in '{out_dir}': {e.strerror or e}") from None

    def close(self):
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()

    def discard(self):
        for f in self.files.values():
            f.close()
        for p in self.tmp.values():
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass

    def publish(self, remove_first=()):
        # The manifest goes last; until then an old manifest must not describe new files.
        for n in remove_first:
            try:
                os.unlink(os.path.join(self.out_dir, n))
            except FileNotFoundError:
                pass
        for n in sorted(self.tmp, key=lambda n: n == "manifest.json"):
            os.rename(self.tmp[n], os.path.join(self.out_dir, n))
        dfd = os.open(self.out_dir, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)


def prepare_out_dir(out_dir):
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise CorpusError(f"--out: '{out_dir}' exists and is not a directory")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise CorpusError(f"--out: cannot create '{out_dir}': {e.strerror or e}") from None


def cmd_linux(args):
    t0 = time.monotonic()
    args.exclude = sorted(set(args.exclude))
    source = args.source if args.source is not None else default_source()
    src_info = check_source(source)
    prepare_out_dir(args.out)
    names = ["train.txt", "val.txt", "manifest.json"]
    if args.pack:
        names += ["train.txt.xz", "val.txt.xz"]
    out = AtomicOutputs(args.out, names)  # fails now, before the long read, if --out is unwritable
    try:
        root, members, counts = read_archive(source)
        kept, dropped, n_excluded, skipped = select_files(root, members, args.max_bytes, args.exclude)
        del members
        stats = {k: {"files": 0, "bytes": 0, "sha256": hashlib.sha256()} for k in OUTPUTS}
        xz = {k: lzma.LZMACompressor(preset=XZ_PRESET) for k in OUTPUTS} if args.pack else None
        packed = {k: hashlib.sha256() for k in OUTPUTS}
        packed_bytes = dict.fromkeys(OUTPUTS, 0)

        def write_xz(k, chunk):
            out.files[f"{k}.txt.xz"].write(chunk)
            packed[k].update(chunk)
            packed_bytes[k] += len(chunk)

        for parts, val in kept:
            k = "val" if val else "train"
            s = stats[k]
            s["files"] += 1
            for part in parts:
                out.files[f"{k}.txt"].write(part)
                s["bytes"] += len(part)
                s["sha256"].update(part)
                if xz:
                    write_xz(k, xz[k].compress(part))
        if xz:
            for k in OUTPUTS:
                write_xz(k, xz[k].flush())
        for k in OUTPUTS:
            if stats[k]["files"] == 0:
                why = f" within --max-bytes {args.max_bytes}" if args.max_bytes is not None else ""
                raise CorpusError(f"no file of '{source}' goes to {k}.txt{why}: the trainer needs both")
            stats[k]["sha256"] = stats[k]["sha256"].hexdigest()
            stats[k] = {"file": f"{k}.txt", **stats[k]}
        n_train, n_val = stats["train"]["bytes"], stats["val"]["bytes"]
        manifest = {
            "corpus": "linux",
            "source": src_info,
            "archive_root": root,
            "rules": {**RULES, "exclude_paths": args.exclude, "max_bytes_value": args.max_bytes},
            "archive": counts,
            "excluded_files": n_excluded,
            "selected_files": len(kept) + dropped,
            "dropped_by_max_bytes": dropped,
            "skipped": skipped,
            "train": stats["train"],
            "val": stats["val"],
            # The trainer splits one file itself (the last ceil(val_fraction * n) bytes), so
            # train.txt then val.txt with this fraction gives exactly val.txt as its validation set.
            "trainer": {"data": "train.txt followed by val.txt (cat train.txt val.txt > all.txt)",
                        "bytes": n_train + n_val,
                        "val_fraction": (n_val - 0.5) / (n_train + n_val)},
        }
        if args.pack:
            manifest["packed"] = {f"{k}.txt.xz": {"bytes": packed_bytes[k], "sha256": packed[k].hexdigest(),
                                                  "xz_preset": XZ_PRESET} for k in OUTPUTS}
        out.files["manifest.json"].write((json.dumps(manifest, indent=2) + "\n").encode())
        out.close()
        # Without --pack, .xz files of an earlier run would no longer match the manifest.
        out.publish(remove_first=("manifest.json",) + (() if args.pack else ("train.txt.xz", "val.txt.xz")))
    except OSError as e:
        out.discard()
        raise CorpusError(f"--out: cannot write in '{args.out}': {e.strerror or e}") from None
    except BaseException:
        out.discard()
        raise
    print(f"source {src_info['name']}: {src_info['bytes']} bytes, sha256 {src_info['sha256']}")
    print(f"archive: {counts['members']} members, {counts['regular']} regular files; "
          f"{len(kept) + dropped} selected, skipped {len(skipped['binary'])} binary, "
          f"{len(skipped['not_utf8'])} not UTF-8, {len(skipped['bad_name'])} bad names"
          + (f"; {n_excluded} excluded" if args.exclude else "")
          + (f"; {dropped} past --max-bytes" if args.max_bytes is not None else ""))
    for k in OUTPUTS:
        s = stats[k]
        print(f"{os.path.join(args.out, s['file'])}: {s['files']} files, {s['bytes']} bytes, sha256 {s['sha256']}")
    if args.pack:
        for n, p in manifest["packed"].items():
            print(f"{os.path.join(args.out, n)}: {p['bytes']} bytes, sha256 {p['sha256']}")
    print(f"trainer: cat train.txt val.txt > all.txt; --val-fraction {manifest['trainer']['val_fraction']!r}")
    print(f"{time.monotonic() - t0:.1f} s")
    return 0


def cmd_unpack(args):
    d = args.dir
    try:
        with open(os.path.join(d, "manifest.json"), "rb") as f:
            manifest = json.load(f)
        expected = {k: {"bytes": int(manifest[k]["bytes"]), "sha256": str(manifest[k]["sha256"])} for k in OUTPUTS}
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise CorpusError(f"DIR: no usable manifest.json in '{d}' ({type(e).__name__}: {e})") from None
    for k in OUTPUTS:
        if not os.path.isfile(os.path.join(d, f"{k}.txt.xz")):
            raise CorpusError(f"DIR: '{os.path.join(d, k + '.txt.xz')}' is missing (made by `linux --pack`)")
    out = AtomicOutputs(d, [f"{k}.txt" for k in OUTPUTS], what="DIR")
    try:
        for k in OUTPUTS:
            h = hashlib.sha256()
            n = 0
            try:
                with lzma.open(os.path.join(d, f"{k}.txt.xz"), "rb") as f:
                    while chunk := f.read(1 << 20):
                        out.files[f"{k}.txt"].write(chunk)
                        h.update(chunk)
                        n += len(chunk)
            except (lzma.LZMAError, EOFError) as e:
                raise CorpusError(f"DIR: '{k}.txt.xz' is not a whole xz file: {e}") from None
            if n != expected[k]["bytes"] or h.hexdigest() != expected[k]["sha256"]:
                raise CorpusError(f"DIR: '{k}.txt.xz' gives {n} bytes, sha256 {h.hexdigest()}; the manifest "
                                  f"says {expected[k]['bytes']} bytes, sha256 {expected[k]['sha256']}")
            print(f"{os.path.join(d, k + '.txt')}: {n} bytes, sha256 {h.hexdigest()} (matches manifest.json)")
        out.close()
        out.publish()
    except OSError as e:
        out.discard()
        raise CorpusError(f"DIR: cannot write in '{d}': {e.strerror or e}") from None
    except BaseException:
        out.discard()
        raise
    return 0


def positive_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got '{text}'")
    return v


def exclude_path(text):
    path = text.rstrip("/")
    if not path or text.startswith("/") or ".." in path.split("/") or not usable_name(path):
        raise argparse.ArgumentTypeError(f"expected a relative path such as drivers/staging, got '{text}'")
    return path


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    lx = sub.add_parser("linux", help="train.txt/val.txt from the kernel sources tarball")
    lx.add_argument("--source", metavar="TARBALL", help="linux-source tarball (default: the one /usr/src/linux-source-*.tar.xz)")
    lx.add_argument("--out", default="data/linux", metavar="DIR", help="output directory (default: data/linux)")
    lx.add_argument("--exclude", action="append", type=exclude_path, default=[], metavar="PATH",
                    help="leave out the file or directory PATH (below the archive's top directory); repeatable")
    lx.add_argument("--max-bytes", type=positive_int, metavar="N", help="keep the longest prefix of files that fits in N bytes")
    lx.add_argument("--pack", action="store_true", help="also write train.txt.xz and val.txt.xz")
    up = sub.add_parser("unpack", help="restore train.txt/val.txt from the .xz files and check them")
    up.add_argument("dir", metavar="DIR")
    args = p.parse_args(argv)
    # A kill then unwinds like Ctrl-C, so the temporary files are removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        return cmd_linux(args) if args.command == "linux" else cmd_unpack(args)
    except CorpusError as e:
        print(f"prepare_corpus.py {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
