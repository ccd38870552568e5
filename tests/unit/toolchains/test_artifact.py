"""The bundle artifact: reproducible packing, verified unpacking, and every refusal a node makes.

Malicious archives are built here byte by byte with tarfile, so each refusal is tested against a
real archive, not a mocked reader.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import sys
import tarfile
import types
from pathlib import Path

import msgspec
import pytest

from toolchains import build as build_mod
from toolchains.artifact import ArtifactMeta, ArtifactRefused, PackRefused, encode_meta, read_meta
from toolchains.base import BuildOutput
from toolchains.build import UnknownToolchain, build_module
from toolchains.pack import pack
from toolchains.verify import verify_and_unpack

META = ArtifactMeta(
    module="hello",
    bundle="tools",
    version="0.1.0",
    kind="tools",
    language="c",
    entry=["bin/hello"],
    env={"DATA": "{bundle_dir}/share"},
    os="linux",
    arch="amd64",
)
# Incompressible, deterministic bytes: cutting the archive in half lands inside file data.
BLOB = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(2048))


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def make_stage(root: Path) -> Path:
    stage = root / "stage"
    (stage / "bin").mkdir(parents=True)
    (stage / "share" / "deep").mkdir(parents=True)
    (stage / "bin" / "hello").write_bytes(b"#!/bin/sh\necho hello\n")
    (stage / "bin" / "hello").chmod(0o755)
    (stage / "share" / "data.bin").write_bytes(BLOB)
    (stage / "share" / "deep" / "note.txt").write_text("note\n")
    (stage / "share" / "deep" / "note.txt").chmod(0o600)  # odd modes are normalised to 0644
    os.symlink("../share/data.bin", stage / "bin" / "data")
    return stage


# ---------------------------------------------------------------------------------------------
# Packing


def test_pack_is_reproducible_byte_for_byte(tmp_path: Path) -> None:
    stage = make_stage(tmp_path)
    first = pack(stage, META, tmp_path / "out1")
    # Same content elsewhere, other timestamps and other order of creation: same bytes.
    other = tmp_path / "elsewhere" / "stage"
    shutil.copytree(stage, other, symlinks=True)
    for p in other.rglob("*"):
        os.utime(p, (1_700_000_000, 1_700_000_000), follow_symlinks=False)
    second = pack(other, META, tmp_path / "out2")
    assert first.name == second.name == "hello-tools-0.1.0-linux-amd64.tar.gz"
    assert first.read_bytes() == second.read_bytes()


def test_pack_layout_and_canonical_meta(tmp_path: Path) -> None:
    artifact = pack(make_stage(tmp_path), META, tmp_path / "out")
    raw = artifact.read_bytes()
    assert raw[4:8] == b"\0\0\0\0"  # gzip mtime
    assert raw[3] & 0x08 == 0  # no file name in the gzip header
    with tarfile.open(artifact) as tar:
        members = tar.getmembers()
        assert [m.name for m in members] == [
            "bundle.json",
            "bin/data",
            "bin/hello",
            "share/data.bin",
            "share/deep/note.txt",
        ]
        for m in members:
            assert (m.mtime, m.uid, m.gid, m.uname, m.gname) == (0, 0, 0, "", "")
        modes = {m.name: m.mode for m in members if m.isreg()}
        assert modes == {
            "bundle.json": 0o644,
            "bin/hello": 0o755,
            "share/data.bin": 0o644,
            "share/deep/note.txt": 0o644,
        }
        meta_bytes = tar.extractfile("bundle.json").read()  # type: ignore[union-attr]
    meta = read_meta(artifact)
    assert meta_bytes == encode_meta(meta)
    keys = list(msgspec.json.decode(meta_bytes))
    assert keys == sorted(keys)
    assert meta.files["share/data.bin"] == sha(BLOB)
    assert meta.links == {"bin/data": "../share/data.bin"}
    assert meta.exec == ["bin/hello"]
    assert meta.env == {"DATA": "{bundle_dir}/share"}


def test_pack_without_platform_names_no_os_arch(tmp_path: Path) -> None:
    stage = tmp_path / "s"
    stage.mkdir()
    (stage / "main.py").write_text("print(1)\n")
    meta = ArtifactMeta(
        module="m", bundle="b", version="1.2.3", kind="tools", language="python", entry=["python", "main.py"]
    )
    assert pack(stage, meta, tmp_path / "o").name == "m-b-1.2.3.tar.gz"


@pytest.mark.parametrize(
    ("arrange", "problem"),
    [
        (lambda s: os.symlink("/etc/passwd", s / "bin" / "pw"), "absolute path /etc/passwd"),
        (lambda s: os.symlink("../../outside", s / "bin" / "up"), "climbs above the bundle"),
        (lambda s: os.symlink("share/../../x", s / "x"), "not in normal form"),
        (lambda s: os.mkfifo(s / "pipe"), "named pipe"),
        (lambda s: (s / "bundle.json").write_text("{}"), "reserved"),
        (lambda s: (s / "bin" / "hello").chmod(0o644), "not executable"),
        (lambda s: (s / "bin" / "hello").unlink(), "not in the bundle"),
    ],
)
def test_pack_refuses(tmp_path: Path, arrange, problem: str) -> None:
    stage = make_stage(tmp_path)
    arrange(stage)
    with pytest.raises(PackRefused, match=problem):
        pack(stage, META, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ---------------------------------------------------------------------------------------------
# Unpacking what pack made


def test_round_trip_keeps_content_exec_bits_and_links(tmp_path: Path) -> None:
    stage = make_stage(tmp_path)
    artifact = pack(stage, META, tmp_path / "out")
    dest = tmp_path / "nodes" / "hello-tools"
    meta = verify_and_unpack(artifact, dest)
    assert meta == read_meta(artifact)
    for rel, digest in meta.files.items():
        assert sha((dest / rel).read_bytes()) == digest == sha((stage / rel).read_bytes())
    assert (dest / "bin" / "hello").stat().st_mode & 0o777 == 0o755
    assert (dest / "share" / "data.bin").stat().st_mode & 0o777 == 0o644
    assert (dest / "share" / "deep" / "note.txt").stat().st_mode & 0o777 == 0o644
    assert os.readlink(dest / "bin" / "data") == "../share/data.bin"
    assert (dest / "bin" / "data").read_bytes() == BLOB
    assert sorted(p.name for p in dest.parent.iterdir()) == ["hello-tools"]  # no temp folders left


def test_unpack_replaces_existing_dest_only_when_verified(tmp_path: Path) -> None:
    artifact = pack(make_stage(tmp_path), META, tmp_path / "out")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    verify_and_unpack(artifact, dest)
    assert not (dest / "old.txt").exists()
    assert (dest / "bin" / "hello").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest", "out", "stage"]


# ---------------------------------------------------------------------------------------------
# Refusals, each from a real archive


def meta_for(files: dict[str, bytes], links: dict[str, str] | None = None, *, entry: str = "bin/hello", **over) -> dict:
    meta = msgspec.to_builtins(META)
    meta.update(
        entry=[entry],
        files={k: sha(v) for k, v in files.items()},
        links=links or {},
        exec=sorted(k for k in files if k == entry),
    )
    meta.update(over)
    return meta


GOOD = {"bin/hello": b"#!/bin/sh\necho hello\n", "share/data.bin": BLOB}


def make_tar(path: Path, members: list[tuple[str, bytes, bytes | str | None]], meta: dict | bytes | None) -> Path:
    """members: (name, type, content or link target); meta first unless None."""
    buf = io.BytesIO()
    with (
        gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar,
    ):
        if meta is not None:
            data = meta if isinstance(meta, bytes) else msgspec.json.encode(meta)
            info = tarfile.TarInfo("bundle.json")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for name, kind, payload in members:
            info = tarfile.TarInfo(name)
            info.type = kind
            info.mode = 0o755 if name == "bin/hello" else 0o644
            if kind == tarfile.REGTYPE:
                assert isinstance(payload, bytes)
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
            else:
                if isinstance(payload, str):
                    info.linkname = payload
                tar.addfile(info)
    path.write_bytes(buf.getvalue())
    return path


def good_members() -> list[tuple[str, bytes, bytes | str | None]]:
    return [(name, tarfile.REGTYPE, data) for name, data in GOOD.items()]


def cases(tmp: Path) -> dict[str, tuple[Path, str]]:
    """name -> (malicious artifact, words the refusal must contain)."""
    reg, sym, lnk = tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
    a = lambda name: tmp / f"{name}.tar.gz"  # noqa: E731
    good = make_tar(a("good"), good_members(), meta_for(GOOD))
    raw = good.read_bytes()
    (half := a("truncated")).write_bytes(raw[: len(raw) // 2])
    (junk := a("not-gzip")).write_bytes(b"this is not an archive at all")
    tampered = dict(GOOD, **{"share/data.bin": BLOB[:-1] + b"X"})
    return {
        "dotdot": (make_tar(a("dotdot"), good_members() + [("../evil", reg, b"x")], meta_for(GOOD)), "`..`"),
        "dotdot-inside": (
            make_tar(a("dotdot-in"), good_members() + [("share/../../evil", reg, b"x")], meta_for(GOOD)),
            "`..`",
        ),
        "absolute": (make_tar(a("abs"), good_members() + [("/abs", reg, b"x")], meta_for(GOOD)), "absolute"),
        "symlink-etc-passwd": (
            make_tar(
                a("sym-abs"), good_members() + [("pw", sym, "/etc/passwd")], meta_for(GOOD, {"pw": "/etc/passwd"})
            ),
            "absolute path /etc/passwd",
        ),
        "symlink-etc-passwd-unlisted": (
            make_tar(a("sym-abs2"), good_members() + [("pw", sym, "/etc/passwd")], meta_for(GOOD)),
            "not listed",
        ),
        "symlink-up": (
            make_tar(a("sym-up"), good_members() + [("bin/x", sym, "../../x")], meta_for(GOOD, {"bin/x": "../../x"})),
            "climbs above the bundle",
        ),
        # `d` -> "." is harmless alone, but `d/../x` would climb out through it.
        "symlink-through-link": (
            make_tar(
                a("sym-via"),
                good_members() + [("d", sym, "."), ("x", sym, "d/../../etc")],
                meta_for(GOOD, {"d": ".", "x": "d/../../etc"}),
            ),
            "not in normal form",
        ),
        "file-under-link": (
            make_tar(
                a("under-link"),
                [("d", sym, "bin")] + good_members() + [("d/evil", reg, b"x")],
                meta_for(dict(GOOD, **{"d/evil": b"x"}), {"d": "bin"}),
            ),
            "which is a link, not a folder",
        ),
        "symlink-differs-from-meta": (
            make_tar(a("sym-diff"), good_members() + [("l", sym, "/etc/shadow")], meta_for(GOOD, {"l": "bin/hello"})),
            "but bundle.json says",
        ),
        "hardlink": (make_tar(a("hard"), good_members() + [("h", lnk, "bin/hello")], meta_for(GOOD)), "hardlink"),
        "hardlink-out": (
            make_tar(a("hard-out"), good_members() + [("h", lnk, "/etc/passwd")], meta_for(GOOD)),
            "hardlink",
        ),
        "fifo": (make_tar(a("fifo"), good_members() + [("p", tarfile.FIFOTYPE, None)], meta_for(GOOD)), "named pipe"),
        "device": (make_tar(a("dev"), good_members() + [("null", tarfile.CHRTYPE, None)], meta_for(GOOD)), "device"),
        "tampered": (
            make_tar(a("tampered"), [(n, reg, d) for n, d in tampered.items()], meta_for(GOOD)),
            "has sha256",
        ),
        "truncated": (half, "truncated or corrupt"),
        "not-gzip": (junk, "truncated or corrupt"),
        "no-bundle-json": (make_tar(a("no-meta"), good_members(), None), "starts with the file bundle.json"),
        "bundle-json-not-first": (
            make_tar(
                a("late-meta"), good_members() + [("bundle.json", reg, msgspec.json.encode(meta_for(GOOD)))], None
            ),
            "starts with the file bundle.json",
        ),
        "bad-json": (make_tar(a("bad-json"), good_members(), b"{not json"), "not valid JSON"),
        "bad-meta-field": (make_tar(a("bad-field"), good_members(), meta_for(GOOD, kind="daemon")), "invalid"),
        "unknown-format": (make_tar(a("fmt"), good_members(), meta_for(GOOD, format=2)), "format 2"),
        "bad-hash-text": (
            make_tar(
                a("hash"), good_members(), dict(meta_for(GOOD), files={**meta_for(GOOD)["files"], "bin/hello": "abc"})
            ),
            "64 lowercase hex",
        ),
        "extra-unlisted": (
            make_tar(a("extra"), good_members() + [("extra.sh", reg, b"rm -rf ~")], meta_for(GOOD)),
            "not listed",
        ),
        "listed-missing": (make_tar(a("missing"), good_members()[:1], meta_for(GOOD)), "missing from the archive"),
        "duplicate": (
            make_tar(a("dup"), good_members() + [("bin/hello", reg, GOOD["bin/hello"])], meta_for(GOOD)),
            "appears twice",
        ),
        "folder-entry": (
            make_tar(a("dir"), [("bin", tarfile.DIRTYPE, None)] + good_members(), meta_for(GOOD)),
            "folder entry",
        ),
        "entry-absent": (
            make_tar(a("entry"), good_members(), meta_for(GOOD, entry="bin/nothere")),
            "entry[0] 'bin/nothere' is not in the bundle",
        ),
        "entry-not-exec": (
            make_tar(a("entry-x"), good_members(), dict(meta_for(GOOD), exec=[])),
            "not executable",
        ),
    }


CASE_NAMES = [
    "dotdot",
    "dotdot-inside",
    "absolute",
    "symlink-etc-passwd",
    "symlink-etc-passwd-unlisted",
    "symlink-up",
    "symlink-through-link",
    "file-under-link",
    "symlink-differs-from-meta",
    "hardlink",
    "hardlink-out",
    "fifo",
    "device",
    "tampered",
    "truncated",
    "not-gzip",
    "no-bundle-json",
    "bundle-json-not-first",
    "bad-json",
    "bad-meta-field",
    "unknown-format",
    "bad-hash-text",
    "extra-unlisted",
    "listed-missing",
    "duplicate",
    "folder-entry",
    "entry-absent",
    "entry-not-exec",
]


def test_case_list_is_complete(tmp_path: Path) -> None:
    assert sorted(cases(tmp_path)) == sorted(CASE_NAMES)


def test_the_good_archive_of_the_refusal_tests_is_accepted(tmp_path: Path) -> None:
    good = make_tar(tmp_path / "good.tar.gz", good_members(), meta_for(GOOD))
    verify_and_unpack(good, tmp_path / "dest")
    assert (tmp_path / "dest" / "share" / "data.bin").read_bytes() == BLOB


@pytest.mark.parametrize("case", CASE_NAMES)
def test_refused_and_dest_untouched(tmp_path: Path, case: str) -> None:
    (tmp_path / "arts").mkdir()
    artifact, words = cases(tmp_path / "arts")[case]
    nodes = tmp_path / "nodes"
    dest = nodes / "hello-tools"
    dest.mkdir(parents=True)
    (dest / "keep.txt").write_text("the running version")
    (dest / "bin").mkdir()
    with pytest.raises(ArtifactRefused) as refused:
        verify_and_unpack(artifact, dest)
    message = str(refused.value)
    assert words in message, message
    assert str(artifact) in message
    # The existing bundle is exactly as it was, and no half-unpacked folder is left beside it.
    assert sorted(str(p.relative_to(dest)) for p in dest.rglob("*")) == ["bin", "keep.txt"]
    assert (dest / "keep.txt").read_text() == "the running version"
    assert sorted(p.name for p in nodes.iterdir()) == ["hello-tools"]  # nor an escaped ../evil


def test_refused_into_fresh_dest_leaves_nothing(tmp_path: Path) -> None:
    artifact, _ = cases(tmp_path)["tampered"]
    dest = tmp_path / "nodes" / "fresh"
    with pytest.raises(ArtifactRefused):
        verify_and_unpack(artifact, dest)
    assert list((tmp_path / "nodes").iterdir()) == []


def test_read_meta_refuses_without_bundle_json(tmp_path: Path) -> None:
    artifact, _ = cases(tmp_path)["no-bundle-json"]
    with pytest.raises(ArtifactRefused, match="bundle.json"):
        read_meta(artifact)
    with pytest.raises(ArtifactRefused, match="no such file"):
        read_meta(tmp_path / "nope.tar.gz")


# ---------------------------------------------------------------------------------------------
# The build driver


def write_module(root: Path, language: str = "go", entry: str = '["hello"]') -> Path:
    (root / "src").mkdir(parents=True)
    (root / "module.toml").write_text(
        f'name = "hello-{language}"\nversion = "0.1.0"\n\n[[bundle]]\nname = "tools"\nkind = "tools"\n'
        f'language = "{language}"\nsource = "src"\nentry = {entry}\n'
    )
    return root


def test_unknown_toolchain_module_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = build_mod.importlib.import_module

    def import_module(name: str, *args):
        if name == "toolchains.go":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args)

    monkeypatch.setattr(build_mod.importlib, "import_module", import_module)
    with pytest.raises(UnknownToolchain, match="no toolchain for language 'go'.*no module toolchains.go"):
        build_module(
            write_module(tmp_path / "mod"), tmp_path / "out", cache_dir=tmp_path / "cache", progress=lambda _: None
        )


def test_build_module_with_a_stand_in_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stand-in `toolchains.go` so the driver is tested without a compiler; real ones have their own tests.
    class FakeGo:
        language = "go"

        def check(self) -> None:
            pass

        def build(self, ctx) -> BuildOutput:
            (ctx.stage_dir / "hello").write_bytes(b"#!/bin/sh\n")
            (ctx.stage_dir / "hello").chmod(0o755)
            ctx.log("compiled")
            return BuildOutput(os="linux", arch="amd64")

    fake = types.ModuleType("toolchains.go")
    fake.TOOLCHAIN = FakeGo()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toolchains.go", fake)
    lines: list[str] = []
    paths = build_module(
        write_module(tmp_path / "mod"), tmp_path / "out", cache_dir=tmp_path / "cache", progress=lines.append
    )
    assert [p.name for p in paths] == ["hello-go-tools-0.1.0-linux-amd64.tar.gz"]
    assert read_meta(paths[0]).files.keys() == {"hello"}
    assert lines[0] == "[hello-go/tools] building (go)..."
    assert lines[1] == "[hello-go/tools] compiled"
    assert lines[2].startswith("[hello-go/tools] packed ") and "1 file)" in lines[2]
    assert (tmp_path / "cache" / "go").is_dir()
