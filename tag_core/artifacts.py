"""Artifacts any worker can read: content-addressed files under one root, `TAG_ARTIFACTS`.

The root is a local folder ($TAG_HOME/artifacts by default), a shared file system's path or any fsspec URL
(`s3://bucket/tag`, `memory://`, ...). A file's address is root-relative, `sha256/<2>/<hash>/<name>`, so the
store keeps addresses, never a machine's paths, and the root may move. An address is written once, whole or
not at all, and never rewritten; `fetch` gives a local, hash-checked copy cached under
$TAG_HOME/cache/artifacts/. A folder's address is that of its manifest (each file's address by relative
path). Mutable pointers, such as the current GNN checkpoint, are small ref files `refs/<name>` holding an
address. A value that is not an address is a local path an older TAG stored: it still reads where it exists.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import fsspec

from tag_core.errors import TagInputError

ENV = "TAG_ARTIFACTS"
_ADDRESS = re.compile(r"sha256/([0-9a-f]{2})/([0-9a-f]{64})/([^/]+)")
_CHUNK = 1 << 20
# File systems with a rename write to a temporary name, then move it into place; the others (object
# stores) get one put of the complete object, which appears whole or not at all.
_RENAMES = {"file", "local"}


def _home() -> Path:
    # TAG_HOME as tag_core.store reads it: this foundation module may not import a stage.
    return Path(os.environ.get("TAG_HOME", ".tag")).resolve()


def root() -> str:
    """The artifact root: TAG_ARTIFACTS, or $TAG_HOME/artifacts when unset or empty."""
    return os.environ.get(ENV) or str(_home() / "artifacts")


def _root_fs() -> tuple[fsspec.AbstractFileSystem, str]:
    fs, path = fsspec.core.url_to_fs(root())
    return fs, path.rstrip("/")


def _renames(fs: fsspec.AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    return bool(_RENAMES.intersection(protocols))


def _cache() -> Path:
    return _home() / "cache" / "artifacts"


def is_address(value: str | os.PathLike) -> bool:
    return bool(_ADDRESS.fullmatch(str(value)))


def url(address: str) -> str:
    """Where `address` lies under the root, to show a user (a plain path for a local root)."""
    fs, base = _root_fs()
    full = f"{base}/{address}"
    return full if _renames(fs) else fs.unstrip_protocol(full)


def missing(address: str) -> TagInputError:
    return TagInputError("artifact", f"{address} is missing under {ENV}={root()}")


def _address_of(digest: str, name: str) -> str:
    name = PurePosixPath(str(name)).name
    if name in ("", ".", ".."):
        raise ValueError(f"an artifact needs a file name, got {name!r}")
    return f"sha256/{digest[:2]}/{digest}/{name}"


def put_file(local_path: str | os.PathLike, name: str | None = None) -> str:
    """Store the file at `local_path` (as `name`, by default its own); its address."""
    local_path = Path(local_path)
    with open(local_path, "rb") as source:
        digest = hashlib.file_digest(source, "sha256").hexdigest()
    address = _address_of(digest, name or local_path.name)
    fs, base = _root_fs()
    target = f"{base}/{address}"
    if not fs.exists(target):  # the same bytes are stored once
        if _renames(fs):
            with open(local_path, "rb") as source:
                _write_renamed(fs, target, source)
        else:
            fs.makedirs(target.rpartition("/")[0], exist_ok=True)
            fs.put_file(str(local_path), target)
    return address


def put_bytes(data: bytes, name: str) -> str:
    """Store `data` as `name`; its address."""
    address = _address_of(hashlib.sha256(data).hexdigest(), name)
    fs, base = _root_fs()
    target = f"{base}/{address}"
    if not fs.exists(target):
        _write(fs, target, data)
    return address


def put_folder(local_dir: str | os.PathLike) -> str:
    """Store every file under `local_dir`, then its manifest (the folder's address): the manifest comes
    last, so a folder whose address exists has all its files."""
    local_dir = Path(local_dir)
    files = {p.relative_to(local_dir).as_posix(): put_file(p) for p in sorted(local_dir.rglob("*")) if p.is_file()}
    return put_bytes(json.dumps({"files": files}, indent=1, sort_keys=True).encode(), "manifest.json")


def _write(fs: fsspec.AbstractFileSystem, target: str, data: bytes) -> None:
    if _renames(fs):
        _write_renamed(fs, target, io.BytesIO(data))
    else:
        fs.makedirs(target.rpartition("/")[0], exist_ok=True)
        fs.pipe_file(target, data)


def _write_renamed(fs: fsspec.AbstractFileSystem, target: str, source: BinaryIO) -> None:
    parent = target.rpartition("/")[0]
    fs.makedirs(parent, exist_ok=True)
    temporary = f"{parent}/.{uuid.uuid4().hex}.tmp"  # under the root: the rename stays on one file system
    try:
        with fs.open(temporary, "wb") as out:
            _copy(source, out)
        fs.mv(temporary, target)
    except BaseException:
        if fs.exists(temporary):
            fs.rm(temporary)
        raise


def _copy(source: BinaryIO, out: BinaryIO) -> None:
    shutil.copyfileobj(source, out, _CHUNK)


def exists(value: str | os.PathLike) -> bool:
    """Whether `fetch(value)` would find something (an address under the root, or a local path)."""
    if not is_address(value):
        return Path(value).exists()
    fs, base = _root_fs()
    return (_cache() / str(value)).exists() or fs.exists(f"{base}/{value}")


def fetch(address: str | os.PathLike) -> Path:
    """A local copy of the file at `address`, its hash checked (or the local path an older TAG stored)."""
    address = str(address)
    if not is_address(address):
        return _local(address)
    cached = _cache() / address
    if cached.exists():
        return cached
    fs, base = _root_fs()
    try:
        stream = fs.open(f"{base}/{address}", "rb")
    except FileNotFoundError:
        raise missing(address) from None
    cached.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=cached.parent, prefix=".", suffix=".tmp")
    try:
        digest = hashlib.sha256()
        with stream, os.fdopen(handle, "wb") as out:
            for chunk in iter(lambda: stream.read(_CHUNK), b""):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != _ADDRESS.fullmatch(address).group(2):
            raise TagInputError("artifact", f"{address} under {ENV}={root()} does not match its hash")
        os.replace(temporary, cached)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return cached


def fetch_folder(address: str | os.PathLike) -> Path:
    """A local copy of the folder whose manifest is at `address` (or the local folder an older TAG stored).
    The copy is the cache's: copy it before writing into it."""
    address = str(address)
    if not is_address(address):
        return _local(address)
    folder = _cache() / "folders" / _ADDRESS.fullmatch(address).group(2)
    if folder.is_dir():
        return folder
    manifest = json.loads(fetch(address).read_text())
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=folder.parent, prefix=".", suffix=".tmp"))
    try:
        for relative, file_address in manifest["files"].items():
            parts = PurePosixPath(relative).parts
            if not parts or relative.startswith("/") or ".." in parts:
                raise TagInputError("artifact", f"{address}: the manifest names {relative!r}, not a path inside")
            destination = staging.joinpath(*parts)
            destination.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(fetch(file_address), destination)
        try:
            staging.rename(folder)  # whole or not at all
        except OSError:
            if not folder.is_dir():  # not another fetch that got there first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def publish_folder(local_dir: str | os.PathLike, ref: str) -> str:
    """`put_folder`, then point `refs/<ref>` at it (the latest folder of a stage's partition); its address."""
    address = put_folder(local_dir)
    set_ref(ref, address)
    return address


def restore_folder(ref: str, into: str | os.PathLike) -> bool:
    """Copy the folder `refs/<ref>` names into `into` (a working folder another worker left off in);
    False when the ref was never set."""
    address = get_ref(ref)
    if address is None:
        return False
    shutil.copytree(fetch_folder(address), into, dirs_exist_ok=True)  # a copy: the cache's files stay as put
    return True


def _link_or_copy(source: Path, destination: Path) -> None:
    try:
        os.link(source, destination)
    except OSError:  # another file system, or no hard links
        shutil.copyfile(source, destination)


def _local(value: str) -> Path:
    path = Path(value)
    if path.exists():
        return path
    raise TagInputError("artifact", f"{value} does not exist (neither a file here nor an address under {ENV})")


def _ref_target(name: str) -> tuple[fsspec.AbstractFileSystem, str]:
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"a ref name is a relative path, got {name!r}")
    fs, base = _root_fs()
    return fs, f"{base}/refs/{name}"


def set_ref(name: str, address: str) -> None:
    """Point `refs/<name>` at `address`, replacing what it held (one atomic write)."""
    if not is_address(address):
        raise ValueError(f"a ref holds an address, got {address!r}")
    fs, target = _ref_target(name)
    _write(fs, target, address.encode())


def get_ref(name: str) -> str | None:
    """The address `refs/<name>` holds; None when it was never set."""
    fs, target = _ref_target(name)
    try:
        return fs.cat_file(target).decode().strip()
    except FileNotFoundError:
        return None
