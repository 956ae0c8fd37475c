"""Where a lake's files live: a local folder, or any fsspec URL (s3://bucket/prefix, ...).

Tables are Delta tables written by delta-rs through its own object-store layer (its
`storage_options` come from here); DuckDB reads their files through the same storage,
and the lake's own small files (schemas, moved log history) are written whole: a temp
file renamed on a local disk, one PUT on an object store.
"""

from __future__ import annotations

import fnmatch
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# Stores where a single PUT (or a completed multipart upload) appears atomically.
OBJECT_STORES = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"}
# The pip extra or package that brings a protocol's fsspec implementation.
INSTALL_HINTS = {"s3": "thresher[s3]", "s3a": "thresher[s3]", "gs": "gcsfs", "gcs": "gcsfs"}


def is_url(location: str | os.PathLike) -> bool:
    """True for a URL with a protocol other than file:// (a lake that is not a local folder)."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def local_path(location: str | os.PathLike) -> Path:
    """The folder of a local location (a path, or a file:// URL)."""
    return Path(str(location).removeprefix("file://"))


def temp_name(path: str) -> str:
    """A hidden sibling of `path` that no `*.parquet` glob matches."""
    head, _, name = path.rpartition("/")
    return f"{head}/.{name}.{uuid.uuid4().hex[:8]}.tmp"


class LocalStorage:
    """A lake folder on this machine: plain file calls, temp file + atomic rename."""

    remote = False

    def __init__(self, root: Path):
        self.root = root

    @property
    def location(self) -> str:
        """The folder's absolute path."""
        return str(self.root.resolve())

    def join(self, *parts: str) -> str:
        """The path of `parts` under the lake."""
        return str(self.root.joinpath(*parts))

    def exists(self, path: str) -> bool:
        """True when the file exists."""
        return Path(path).exists()

    def ensure_schema(self, path: str, schema: pa.Schema) -> None:
        """Write the empty schema file unless it is there with this very schema."""
        marker = Path(path)
        marker.parent.mkdir(parents=True, exist_ok=True)
        if not marker.exists() or not pq.read_schema(marker).equals(schema):
            self.write_parquet(schema.empty_table(), path)

    def write_parquet(self, data: pa.Table, path: str) -> None:
        """Write `data` to a temp file, then rename it to `path` (atomic on one disk)."""
        tmp = temp_name(path)
        pq.write_table(data, tmp, compression="zstd")
        os.replace(tmp, path)

    def list(self, folder: str) -> list[str]:
        """The paths of the files directly in `folder` (none when it does not exist)."""
        try:
            return [str(p) for p in Path(folder).iterdir() if p.is_file()]
        except FileNotFoundError:
            return []

    def read_bytes(self, path: str) -> bytes:
        """The file's contents."""
        return Path(path).read_bytes()

    def move(self, src: str, dst: str) -> None:
        """Move a file (into a folder made if missing)."""
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
        os.replace(src, dst)

    def delete(self, path: str) -> None:
        """Delete a file or a folder with everything in it."""
        import shutil

        target = Path(path)
        if target.is_dir():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)

    def delta_options(self) -> dict[str, str] | None:
        """delta-rs storage options: none for a local folder."""
        return None

    def attach(self, con: Any) -> None:
        """Nothing to do: DuckDB reads local files itself."""

    def refresh(self) -> None:
        """Nothing to do: local listings are never cached."""


class FsspecStorage:
    """A lake under an fsspec URL; files are serialised in memory and uploaded whole."""

    remote = True
    _checked: set[tuple[str, str]] = set()  # schema files this process found current
    _lock = threading.Lock()

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self.protocol = self.url.split("://", 1)[0]
        self.fs = open_filesystem(self.protocol)
        self.atomic_put = bool(OBJECT_STORES & set(_protocols(self.fs)))

    @property
    def location(self) -> str:
        """The lake's URL."""
        return self.url

    def join(self, *parts: str) -> str:
        """The URL of `parts` under the lake."""
        return "/".join((self.url, *parts))

    def exists(self, path: str) -> bool:
        """True when the object exists."""
        return self.fs.exists(path)

    def ensure_schema(self, path: str, schema: pa.Schema) -> None:
        """Write the empty schema file unless it is there with this schema (checked once
        per process: other processes only ever rewrite it with a schema they know)."""
        key = (path, schema.to_string())
        if key in self._checked:
            return
        try:
            current = pq.read_schema(pa.BufferReader(self.fs.cat_file(path)))
        except FileNotFoundError:
            current = None
        if current is None or not current.equals(schema):
            self.write_parquet(schema.empty_table(), path)
        with self._lock:
            self._checked.add(key)

    def write_parquet(self, data: pa.Table, path: str) -> None:
        """Serialise `data`, then upload it whole: straight to `path` on an object store
        (visible only once complete), else to a temp name that is then moved to `path`."""
        sink = pa.BufferOutputStream()
        pq.write_table(data, sink, compression="zstd")
        blob = sink.getvalue().to_pybytes()
        if self.atomic_put:
            self.fs.pipe_file(path, blob)
        else:
            tmp = temp_name(path)
            self.fs.makedirs(path.rpartition("/")[0], exist_ok=True)
            self.fs.pipe_file(tmp, blob)
            self.fs.mv(tmp, path)

    def list(self, folder: str) -> list[str]:
        """The URLs of the objects directly under `folder`."""
        try:
            entries = self.fs.ls(folder, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        return [self._url(e["name"]) for e in entries if e["type"] == "file"]

    def _url(self, name: str) -> str:
        return name if "://" in name else f"{self.protocol}://{name}"

    def read_bytes(self, path: str) -> bytes:
        """The object's contents."""
        return self.fs.cat_file(path)

    def move(self, src: str, dst: str) -> None:
        """Move an object (a copy, then a delete, on object stores)."""
        self.fs.mv(src, dst)

    def delete(self, path: str) -> None:
        """Delete an object, or every object under a prefix."""
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    def delta_options(self) -> dict[str, str]:
        """delta-rs storage options, from the same settings as the fsspec filesystem:
        THRESHER_STORAGE_OPTIONS (endpoint_url, key, secret) over the AWS_* variables, then
        $THRESHER_DELTA_OPTIONS (a JSON object of delta-rs options) over both. Plain http
        endpoints (a local S3 server) are allowed. S3 needs no lock: delta-rs commits with
        conditional writes (If-None-Match)."""
        options: dict[str, str] = {}
        if self.protocol in ("s3", "s3a"):
            fs_options = storage_options(self.protocol)
            client = fs_options.get("client_kwargs") or {}
            endpoint = (
                client.get("endpoint_url")
                or fs_options.get("endpoint_url")
                or os.environ.get("AWS_ENDPOINT_URL_S3")
                or os.environ.get("AWS_ENDPOINT_URL")
            )
            if endpoint:
                options["AWS_ENDPOINT_URL"] = endpoint
                if endpoint.startswith("http://"):
                    options["AWS_ALLOW_HTTP"] = "true"
            for fs_key, key in (("key", "AWS_ACCESS_KEY_ID"), ("secret", "AWS_SECRET_ACCESS_KEY")):
                if fs_options.get(fs_key):
                    options[key] = str(fs_options[fs_key])
            region = (
                client.get("region_name")
                or os.environ.get("AWS_REGION")
                or os.environ.get("AWS_DEFAULT_REGION")
            )
            options["AWS_REGION"] = region or "us-east-1"
        raw = os.environ.get("THRESHER_DELTA_OPTIONS") or "{}"
        try:
            extra = json.loads(raw)
        except json.JSONDecodeError as e:
            raise ValueError(f"THRESHER_DELTA_OPTIONS is not JSON: {e}") from None
        return {**options, **{k: str(v) for k, v in extra.items()}}

    def attach(self, con: Any) -> None:
        """Let DuckDB read this filesystem's URLs (no DuckDB extension needed)."""
        con.register_filesystem(self.fs)

    def refresh(self) -> None:
        """Forget cached listings so the next query sees other processes' appends."""
        self.fs.invalidate_cache()


def _protocols(fs: Any) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


def storage_options(protocol: str) -> dict[str, Any]:
    """Options for the fsspec filesystem: $THRESHER_STORAGE_OPTIONS (a JSON object), with
    listings never cached (each query must see every committed file)."""
    raw = os.environ.get("THRESHER_STORAGE_OPTIONS") or "{}"
    try:
        options = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ValueError(f"THRESHER_STORAGE_OPTIONS is not JSON: {e}") from None
    if not isinstance(options, dict):
        raise ValueError("THRESHER_STORAGE_OPTIONS must be a JSON object")
    return {**options, "use_listings_cache": False}


_FILESYSTEMS: dict[tuple[int, str, str], Any] = {}
_FILESYSTEMS_LOCK = threading.Lock()


def open_filesystem(protocol: str) -> Any:
    """The fsspec filesystem for `protocol`, one per process and options; credentials and
    endpoint come from the environment (for S3: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_ENDPOINT_URL or AWS_ENDPOINT_URL_S3, AWS_PROFILE, ...) when it is first opened."""
    options = storage_options(protocol)
    key = (os.getpid(), protocol, json.dumps(options, sort_keys=True, default=str))
    with _FILESYSTEMS_LOCK:
        if key not in _FILESYSTEMS:
            _FILESYSTEMS[key] = remember_part_info(_new_filesystem(protocol, options))
        return _FILESYSTEMS[key]


def _new_filesystem(protocol: str, options: dict[str, Any]) -> Any:
    try:
        import fsspec

        return fsspec.filesystem(protocol, skip_instance_cache=True, **options)
    except ImportError as e:
        package = INSTALL_HINTS.get(protocol, f"the fsspec implementation of {protocol}://")
        raise ImportError(
            f"a lake at {protocol}:// needs {package}: pip install '{package}' ({e})"
        ) from None


def _list_matching(fs: Any, folder: str, pattern: str) -> dict[str, dict]:
    """The files directly in `folder` whose names match `pattern`, with their details."""
    try:
        entries = fs.ls(folder, detail=True)
    except FileNotFoundError:
        return {}
    return {
        e["name"]: e
        for e in entries
        if e["type"] == "file" and fnmatch.fnmatchcase(e["name"].rpartition("/")[2], pattern)
    }


def _is_part(path: str) -> bool:
    return path.rpartition("/")[2].startswith("part-")


def remember_part_info(fs: Any) -> Any:
    """Make `fs` answer DuckDB's questions about listed files from the listing.

    DuckDB globs each file a view names and asks for its size, date and details several
    times per query, one request each. Listings are never cached, and a file's details
    come from the latest listing or look that showed it; part files never change once
    visible (unique names, written whole), so theirs are kept for good.
    """
    known: dict[str, dict] = {}
    glob, info = fs.glob, fs.info

    def glob_parts(path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        if kwargs.pop("detail", False):
            return glob(path, maxdepth=maxdepth, detail=True, **kwargs)
        stripped = fs._strip_protocol(path)
        if maxdepth is None and not kwargs and not set("*?[") & set(stripped):
            # a view lists its files by name and DuckDB globs each one: a name matches
            # itself, so ask about that file (known parts: nothing) instead of listing
            try:
                return [info_parts(stripped)["name"]]
            except FileNotFoundError:
                return []
        folder, _, pattern = stripped.rpartition("/")
        simple = folder and not set("*?[") & set(folder) and "**" not in pattern
        if maxdepth is None and not kwargs and simple:
            found = _list_matching(fs, folder, pattern)  # one listing request
        else:
            found = glob(path, maxdepth=maxdepth, detail=True, **kwargs)
        known.update(found)
        return list(found)

    def info_parts(path: str, **kwargs: Any) -> dict:
        key = fs._strip_protocol(path)
        if any(kwargs.values()):  # a version, a refresh: ask the store
            return info(path, **kwargs)
        found = known.get(key) or info(path)
        if _is_part(key):
            known[key] = found
        return dict(found)

    def size_parts(path: str) -> int | None:
        return info_parts(path).get("size")

    fs.glob, fs.info, fs.size = glob_parts, info_parts, size_parts
    return fs


# Where delta-rs can keep a Delta table (besides local folders).
DELTA_PROTOCOLS = {"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss", "azure"}


def open_storage(location: str | os.PathLike) -> LocalStorage | FsspecStorage:
    """The storage of a lake location: a local folder, or an object-store URL."""
    if is_url(location):
        protocol = str(location).split("://", 1)[0]
        if protocol not in DELTA_PROTOCOLS:
            raise ValueError(
                f"a lake cannot live at {protocol}:// (its tables are Delta tables, which "
                f"need a local folder or one of {', '.join(sorted(DELTA_PROTOCOLS))}://)"
            )
        return FsspecStorage(str(location))
    return LocalStorage(local_path(location))
