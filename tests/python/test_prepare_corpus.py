"""scripts/prepare_corpus.py on small synthetic kernel-like tarballs: which files are taken, their
order and separators, the hash split (recomputed here), determinism, the manifest, --max-bytes,
--pack/unpack and the error exits."""
import hashlib
import io
import json
import lzma
import math
import os
import pathlib
import random
import subprocess
import sys
import tarfile

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "prepare_corpus.py"
ROOT = "linux-source-9.9"


def goes_to_val(path):
    # The documented rule, written out independently of the script.
    h = hashlib.sha256(path.encode()).hexdigest()
    return int(h[:16], 16) % 100 == 0


def find_names(pattern, want_val, count, rng):
    """`count` paths of the form pattern.format(random tag) whose split is want_val."""
    out = []
    while len(out) < count:
        name = pattern.format(rng.randrange(10**9))
        if goes_to_val(name) == want_val and name not in out:
            out.append(name)
    return out


def random_text(rng, n):
    words = ["int", "return", "struct", "static", "void", "{", "}", ";", "\n", "/* é ü */", "\t", "x", "0x1f"]
    return "".join(rng.choice(words) + " " for _ in range(n)).encode()


def make_tarball(path, files, extra_members=(), order_seed=0):
    """files: {path below ROOT: bytes}; written in a shuffled order so the script must sort."""
    items = list(files.items())
    random.Random(order_seed).shuffle(items)
    with tarfile.open(path, "w:xz") as tar:
        d = tarfile.TarInfo(ROOT)
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        for name, data in items:
            info = tarfile.TarInfo(f"{ROOT}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra_members:
            tar.addfile(info)
    return path


def run(*args, cwd=None):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, cwd=cwd)


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(1234)
    val_c = find_names("drivers/net/v{}.c", True, 2, rng)
    train_c = find_names("kernel/sched/t{}.c", False, 3, rng)
    files = {}
    for name in val_c + train_c:
        files[name] = random_text(rng, rng.randrange(50, 400))
    files["include/linux/list.h"] = b"#define LIST_HEAD(x) x\n"
    files["include/linux/nonl.h"] = b"/* no newline at the end */"  # gets one
    files["include/linux/empty.h"] = b""
    files["Documentation/admin-guide/README.rst"] = "Linux — the kernel\n".encode()
    files["Documentation/process/howto.txt"] = b"how to\n"
    files["Documentation/dev-tools/Makefile"] = b"all:\n"          # not .rst/.txt
    files["Documentation/sphinx/conf.py"] = b"x = 1\n"             # not .rst/.txt
    files["tools/perf/Documentation/perf.txt"] = b"perf\n"        # .txt outside Documentation/
    files["README.txt"] = b"top-level txt\n"                      # .txt outside Documentation/
    files["scripts/checkpatch.pl"] = b"#!/usr/bin/perl\n"          # not selected
    files["drivers/gpu/firmware.h"] = b"static const char fw[] = \"\x00\x01\";\n"  # NUL: binary
    files["drivers/isdn/latin1.c"] = b"/* Copyright J\xf6rg */\n"  # Latin-1: not UTF-8
    files["drivers/misc/overlong.c"] = b"/* \xc0\xaf */\n"          # overlong: not UTF-8
    link = tarfile.TarInfo(f"{ROOT}/include/linux/link.h")
    link.type = tarfile.SYMTYPE
    link.linkname = "list.h"
    src = make_tarball(tmp_path / "linux-source-9.9.tar.xz", files, [link])
    return {"src": src, "files": files, "val": val_c, "tmp": tmp_path}


def expected_outputs(files, keep):
    train, val = b"", b""
    for name in sorted(keep, key=lambda s: s.encode()):
        data = files[name]
        rec = b"### file: " + name.encode() + b"\n" + data + (b"\n" if data and not data.endswith(b"\n") else b"")
        if goes_to_val(name):
            val += rec
        else:
            train += rec
    return train, val


def selected_text(files):
    """The fixture's files the rules take: by name, then not binary and valid UTF-8."""
    def text(data):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            return False
        return b"\0" not in data
    return [n for n in files
            if (n.endswith((".c", ".h")) or (n.startswith("Documentation/") and n.endswith((".rst", ".txt"))))
            and text(files[n])]


def test_selection_order_split_and_manifest(corpus):
    out = corpus["tmp"] / "out"
    r = run("linux", "--source", corpus["src"], "--out", out)
    assert r.returncode == 0, r.stderr
    files = corpus["files"]
    keep = selected_text(files)
    assert "include/linux/empty.h" in keep and "README.txt" not in keep
    train, val = expected_outputs(files, keep)
    assert (out / "train.txt").read_bytes() == train
    assert (out / "val.txt").read_bytes() == val
    assert len(val) > 0 and b"### file: drivers/net/v" in val
    assert b"/* no newline at the end */\n### file:" in train  # a newline is added before the next separator

    m = json.loads((out / "manifest.json").read_text())
    raw = corpus["src"].read_bytes()
    assert m["source"] == {"name": "linux-source-9.9.tar.xz", "bytes": len(raw),
                           "sha256": hashlib.sha256(raw).hexdigest()}
    assert m["archive_root"] == ROOT + "/"
    n_val_files = sum(goes_to_val(n) for n in keep)
    assert m["val"] == {"file": "val.txt", "files": n_val_files, "bytes": len(val),
                        "sha256": hashlib.sha256(val).hexdigest()}
    assert m["train"] == {"file": "train.txt", "files": len(keep) - n_val_files, "bytes": len(train),
                          "sha256": hashlib.sha256(train).hexdigest()}
    assert m["skipped"] == {"binary": ["drivers/gpu/firmware.h"],
                            "not_utf8": ["drivers/isdn/latin1.c", "drivers/misc/overlong.c"], "bad_name": []}
    assert m["archive"] == {"members": len(files) + 2, "regular": len(files), "not_regular": 1}
    assert m["dropped_by_max_bytes"] == 0 and m["selected_files"] == len(keep)
    assert "sha256(path)" in m["rules"]["split"] and m["rules"]["max_bytes_value"] is None
    # The trainer keeps the last ceil(val_fraction * n) bytes of one file for validation
    # (src/train/data.cpp): with train.txt + val.txt that must be exactly val.txt.
    n = len(train) + len(val)
    f = m["trainer"]["val_fraction"]
    assert m["trainer"]["bytes"] == n and math.ceil(f * n) == len(val)
    assert "packed" not in m and not (out / "train.txt.xz").exists()
    assert sorted(os.listdir(out)) == ["manifest.json", "train.txt", "val.txt"]  # no temporaries left
    assert hashlib.sha256(train).hexdigest() in r.stdout and hashlib.sha256(val).hexdigest() in r.stdout


def test_deterministic_across_runs_and_member_order(corpus):
    a, b, c = (corpus["tmp"] / x for x in "abc")
    assert run("linux", "--source", corpus["src"], "--out", a).returncode == 0
    assert run("linux", "--source", corpus["src"], "--out", b).returncode == 0
    for n in ("train.txt", "val.txt", "manifest.json"):
        assert (a / n).read_bytes() == (b / n).read_bytes()
    # Same files in another archive order: the same corpus.
    (corpus["tmp"] / "other").mkdir()
    other = make_tarball(corpus["tmp"] / "other" / "linux-source-9.9.tar.xz", corpus["files"], order_seed=7)
    assert run("linux", "--source", other, "--out", c).returncode == 0
    for n in ("train.txt", "val.txt"):
        assert (a / n).read_bytes() == (c / n).read_bytes()


def test_val_split_on_many_paths(tmp_path):
    # Enough random paths that a wrong rule (another modulus, digest slice or byte order) shows.
    rng = random.Random(99)
    files = {f"fs/d{rng.randrange(10**6)}/f{i}.c": f"int f{i};\n".encode() for i in range(1500)}
    src = make_tarball(tmp_path / "l.tar.xz", files)
    out = tmp_path / "out"
    r = run("linux", "--source", src, "--out", out)
    assert r.returncode == 0, r.stderr
    train, val = expected_outputs(files, list(files))
    assert 5 <= sum(goes_to_val(n) for n in files) <= 30
    assert (out / "val.txt").read_bytes() == val and (out / "train.txt").read_bytes() == train


def test_max_bytes_keeps_a_prefix(corpus):
    files = corpus["files"]
    keep = sorted(selected_text(files), key=lambda s: s.encode())
    sizes = [len(b"### file: " + n.encode() + b"\n") + len(files[n]) + (1 if files[n] and not files[n].endswith(b"\n") else 0)
             for n in keep]
    # The smallest prefix holding a val file and a train file, plus a few bytes short of the next file.
    i = next(i for i in range(len(keep)) if any(goes_to_val(n) for n in keep[:i + 1])
             and not all(goes_to_val(n) for n in keep[:i + 1]))
    limit = sum(sizes[:i + 1]) + sizes[i + 1] - 1
    out = corpus["tmp"] / "cut"
    r = run("linux", "--source", corpus["src"], "--out", out, "--max-bytes", limit)
    assert r.returncode == 0, r.stderr
    train, val = expected_outputs(files, keep[:i + 1])
    assert (out / "train.txt").read_bytes() == train and (out / "val.txt").read_bytes() == val
    m = json.loads((out / "manifest.json").read_text())
    assert m["dropped_by_max_bytes"] == len(keep) - (i + 1) and m["rules"]["max_bytes_value"] == limit


def test_exclude(corpus):
    out = corpus["tmp"] / "ex"
    r = run("linux", "--source", corpus["src"], "--out", out, "--exclude", "kernel/sched/",
            "--exclude", "include/linux/list.h", "--exclude", "include/linux/lis")  # not a path prefix match
    assert r.returncode == 0, r.stderr
    keep = [n for n in selected_text(corpus["files"])
            if not n.startswith("kernel/sched/") and n != "include/linux/list.h"]
    train, val = expected_outputs(corpus["files"], keep)
    assert (out / "train.txt").read_bytes() == train and (out / "val.txt").read_bytes() == val
    m = json.loads((out / "manifest.json").read_text())
    assert m["rules"]["exclude_paths"] == ["include/linux/lis", "include/linux/list.h", "kernel/sched"]
    assert m["excluded_files"] == 4
    for bad in ("/usr", "drivers/../kernel", "", "/"):
        r = run("linux", "--source", corpus["src"], "--out", out, "--exclude", bad)
        assert r.returncode == 2 and "--exclude" in r.stderr


def test_pack_and_unpack(corpus):
    out = corpus["tmp"] / "packed"
    r = run("linux", "--source", corpus["src"], "--out", out, "--pack")
    assert r.returncode == 0, r.stderr
    train, val = (out / "train.txt").read_bytes(), (out / "val.txt").read_bytes()
    m = json.loads((out / "manifest.json").read_text())
    for n, data in (("train.txt", train), ("val.txt", val)):
        xz = (out / (n + ".xz")).read_bytes()
        assert lzma.decompress(xz) == data
        assert m["packed"][n + ".xz"]["sha256"] == hashlib.sha256(xz).hexdigest()
    # On the GPU machine only the .xz files and the manifest travel.
    gpu = corpus["tmp"] / "gpu"
    gpu.mkdir()
    for n in ("train.txt.xz", "val.txt.xz", "manifest.json"):
        (gpu / n).write_bytes((out / n).read_bytes())
    r = run("unpack", gpu)
    assert r.returncode == 0, r.stderr
    assert (gpu / "train.txt").read_bytes() == train and (gpu / "val.txt").read_bytes() == val
    assert (gpu / "manifest.json").read_bytes() == (out / "manifest.json").read_bytes()
    # A corrupted pack is refused and leaves no text file behind.
    bad = corpus["tmp"] / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_bytes((out / "manifest.json").read_bytes())
    (bad / "train.txt.xz").write_bytes((out / "train.txt.xz").read_bytes())
    (bad / "val.txt.xz").write_bytes(lzma.compress(val + b"x"))
    r = run("unpack", bad)
    assert r.returncode == 2 and "val.txt.xz" in r.stderr and "manifest" in r.stderr
    assert sorted(os.listdir(bad)) == ["manifest.json", "train.txt.xz", "val.txt.xz"]
    # A later run without --pack removes the .xz files that no longer match its manifest.
    assert run("linux", "--source", corpus["src"], "--out", out, "--max-bytes", 10**9).returncode == 0
    assert not (out / "train.txt.xz").exists() and "packed" not in json.loads((out / "manifest.json").read_text())


def test_errors_exit_2_and_write_nothing(corpus, tmp_path):
    out = tmp_path / "o"
    r = run("linux", "--source", tmp_path / "missing.tar.xz", "--out", out)
    assert r.returncode == 2 and "--source" in r.stderr and "does not exist" in r.stderr
    assert not out.exists()

    r = run("linux", "--source", tmp_path, "--out", out)
    assert r.returncode == 2 and "--source" in r.stderr

    truncated = tmp_path / "trunc.tar.xz"
    truncated.write_bytes(corpus["src"].read_bytes()[: corpus["src"].stat().st_size // 2])
    r = run("linux", "--source", truncated, "--out", out)
    assert r.returncode == 2 and "--source" in r.stderr and "tar archive" in r.stderr
    assert os.listdir(out) == []  # temporaries removed

    notxz = tmp_path / "plain.tar.xz"
    notxz.write_bytes(b"this is not an archive\n" * 100)
    r = run("linux", "--source", notxz, "--out", out)
    assert r.returncode == 2 and "--source" in r.stderr and os.listdir(out) == []

    afile = tmp_path / "afile"
    afile.write_text("x")
    r = run("linux", "--source", corpus["src"], "--out", afile)
    assert r.returncode == 2 and "--out" in r.stderr and "not a directory" in r.stderr

    r = run("linux", "--source", corpus["src"], "--out", "/proc/orthopt-corpus")  # not even root creates it
    assert r.returncode == 2 and "--out" in r.stderr and "cannot create" in r.stderr
    if os.geteuid() != 0:  # root writes through permissions
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o555)
        r = run("linux", "--source", corpus["src"], "--out", ro / "sub")
        assert r.returncode == 2 and "--out" in r.stderr
        r = run("linux", "--source", corpus["src"], "--out", ro)
        assert r.returncode == 2 and "--out" in r.stderr
        assert os.listdir(ro) == []
        ro.chmod(0o755)

    for bad in ("0", "-5", "ten"):
        r = run("linux", "--source", corpus["src"], "--out", out, "--max-bytes", bad)
        assert r.returncode == 2 and "--max-bytes" in r.stderr

    # Too small a cut leaves no validation file: refused, and an earlier corpus stays whole.
    good = tmp_path / "good"
    assert run("linux", "--source", corpus["src"], "--out", good).returncode == 0
    before = {n: (good / n).read_bytes() for n in os.listdir(good)}
    r = run("linux", "--source", corpus["src"], "--out", good, "--max-bytes", 40)
    assert r.returncode == 2 and "--max-bytes 40" in r.stderr
    assert {n: (good / n).read_bytes() for n in os.listdir(good)} == before

    r = run("unpack", tmp_path / "nowhere")
    assert r.returncode == 2 and "manifest.json" in r.stderr
    r = run("unpack", good)  # made without --pack
    assert r.returncode == 2 and "train.txt.xz" in r.stderr and "--pack" in r.stderr
