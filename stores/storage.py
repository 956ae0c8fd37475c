"""Where a lake's files live: a local folder, or any fsspec URL (s3://bucket/prefix, ...).

Both kinds write each Parquet file whole before it becomes visible: a local folder writes
a temp file and renames it; an object store PUTs the final key in one request (or one
completed multipart upload), which the store makes visible only once complete; any other
fsspec filesystem writes a temp name and moves it. Temp names end in `.tmp`, so the lake's
`*.parquet` globs never match them.
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

    DuckDB asks for each file's size, date and details several times per query, one
    request each. Listings are never cached (each query lists every table afresh), and a
    file's details come from the latest listing that showed it; part files never change
    once visible (unique names, written whole), so theirs are kept for good.
    """
    known: dict[str, dict] = {}
    glob, info = fs.glob, fs.info

    def glob_parts(path: str, maxdepth: int | None = None, **kwargs: Any) -> Any:
        if kwargs.pop("detail", False):
            return glob(path, maxdepth=maxdepth, detail=True, **kwargs)
        folder, _, pattern = fs._strip_protocol(path).rpartition("/")
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


def open_storage(location: str | os.PathLike) -> LocalStorage | FsspecStorage:
    """The storage of a lake location: a local folder, or an fsspec URL."""
    if is_url(location):
        return FsspecStorage(str(location))
    return LocalStorage(local_path(location))
