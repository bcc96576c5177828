"""Where a work directory lives: a local folder, or object storage (`s3://bucket/prefix`).

A location is a `pathlib.Path` for a local folder and a `RemotePath` for a URL. The functions
here take either. On a `Path` they are the plain calls lait always made (native paths that
pyarrow opens itself, `open`, `os.replace`), so local I/O never goes through a Python file
wrapper. A `RemotePath` goes through the fsspec filesystem of its protocol (s3fs for s3://).

Atomic files differ between the two:

- locally, a file is written under a hidden temporary name (`.tmp-UUID-NAME`) and renamed into
  place; a killed writer leaves the temporary file, which readers ignore;
- on object storage a rename is a copy, but an object appears only when its PUT or multipart
  upload completes. So files are written straight to their final key, and a writer that is
  aborted (or dropped, or killed) discards its upload: no half object is ever visible, and there
  are no temporary names to clean. An interrupted multipart upload stays invisible until the
  bucket's lifecycle rule (AbortIncompleteMultipartUpload) removes its parts.

Remote filesystems come from `fsspec.core.url_to_fs`, per process: nothing here holds one in
a picklable object (`RemotePath` is a URL), and fsspec drops its cached instances in a forked
child, so a worker never reuses its parent's connection pool or event loop. Listings are never
cached (other processes write into the same prefix), and every listing is made afresh.

Settings come from the environment, so that forked workers, the Scrapy subprocess and Ray
workers on this machine see the same ones: the standard AWS variables (`AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_PROFILE`, `AWS_DEFAULT_REGION`,
`AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` for S3-compatible servers), and
`LAIT_STORAGE_OPTIONS`, a JSON object of extra fsspec options laid over them, e.g.
`{"endpoint_url": "http://minio:9000", "client_kwargs": {"region_name": "eu-west-1"}}`.
"""

from __future__ import annotations

import functools
import json
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pyarrow as pa
import pyarrow.parquet as pq

from lait import errors
from lait.memory import glibc

STORAGE_OPTIONS_ENV = "LAIT_STORAGE_OPTIONS"
_URL_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://(.*)$")
# Extras that provide a protocol's filesystem (fsspec itself names the package for the others).
EXTRAS = {"s3": "s3", "s3a": "s3"}
S3_BLOCK_SIZE = 8 << 20  # upload part size; S3's minimum is 5 MiB


@dataclass(frozen=True, order=True)
class RemotePath:
    """A location in object storage, `PROTOCOL://bucket/key`, with the pathlib operations lait
    uses on work-directory paths. Deliberately not os.PathLike: passing one to `open` fails."""

    url: str

    def __post_init__(self) -> None:
        if not _URL_RE.match(self.url):
            raise ValueError(f"not a URL: {self.url!r}")
        if self.url.endswith("/") and not self.url.endswith("://"):
            object.__setattr__(self, "url", self.url.rstrip("/"))

    @property
    def protocol(self) -> str:
        return _URL_RE.match(self.url).group(1).lower()

    @property
    def bucket(self) -> RemotePath:
        """The bucket (container) that holds this location."""
        rest = _URL_RE.match(self.url).group(2)
        return RemotePath(f"{self.protocol}://{rest.split('/', 1)[0]}")

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.url.rsplit("/", 1)[0])

    def __truediv__(self, name: str | os.PathLike) -> RemotePath:
        name = os.fspath(name)
        if not name or name.startswith("/"):
            raise ValueError(f"cannot join {name!r} to {self.url}")
        return RemotePath(f"{self.url}/{name}")

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def with_suffix(self, suffix: str) -> RemotePath:
        stem = self.name.rsplit(".", 1)[0] if "." in self.name.lstrip(".") else self.name
        return self.with_name(stem + suffix)

    def __str__(self) -> str:
        return self.url


Location = Path | RemotePath


def is_remote_url(location: str | os.PathLike | RemotePath) -> bool:
    """True for a URL that names object storage (`s3://...`); False for local paths and file://."""
    if isinstance(location, RemotePath):
        return True
    if not isinstance(location, str):
        return False
    m = _URL_RE.match(location)
    return bool(m) and m.group(1).lower() not in ("file", "local")


def location(root: str | os.PathLike | RemotePath) -> Location:
    """`root` as a location: a RemotePath for object storage URLs, a Path otherwise."""
    if isinstance(root, RemotePath):
        return root
    if is_remote_url(root):
        return RemotePath(root)
    if isinstance(root, str) and root.startswith(("file://", "local://")):
        root = root.split("://", 1)[1]
    return Path(root)


# -- filesystems ----------------------------------------------------------------------------
def storage_options(protocol: str) -> dict[str, Any]:
    """The fsspec options of a protocol: no listings cache, the S3 endpoint from the AWS
    variables, then `LAIT_STORAGE_OPTIONS`."""
    opts: dict[str, Any] = {"use_listings_cache": False}
    if protocol in ("s3", "s3a"):
        # Each open part buffers one block in memory before uploading it, and a stage task that
        # re-partitions holds a part per partition: 8 MiB blocks instead of s3fs's 50 MiB.
        opts["default_block_size"] = S3_BLOCK_SIZE
        # Passed explicitly (botocore reads them too) so that a changed endpoint is a new fs.
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            opts["endpoint_url"] = endpoint
    extra = os.environ.get(STORAGE_OPTIONS_ENV, "").strip()
    if extra:
        try:
            more = json.loads(extra)
        except ValueError as exc:
            raise ValueError(f"{STORAGE_OPTIONS_ENV} is not valid JSON: {exc}") from None
        if not isinstance(more, dict):
            raise ValueError(f"{STORAGE_OPTIONS_ENV} must be a JSON object of fsspec options")
        opts.update(more)
    return opts


def filesystem(path: RemotePath) -> Any:
    """The fsspec filesystem of a remote location, for this process (fsspec caches instances
    per process and clears that cache in a forked child)."""
    extra = EXTRAS.get(path.protocol)
    hint = f": pip install 'lait[{extra}]'" if extra else ""
    try:
        import fsspec.core
    except ImportError:
        raise ImportError(f"{path.protocol}:// work directories need fsspec{hint or ': pip install fsspec'}") from None
    try:
        fs, _ = fsspec.core.url_to_fs(path.url, **storage_options(path.protocol))
    except ImportError as exc:
        if extra:
            raise ImportError(f"{path.protocol}:// work directories need s3fs{hint}") from None
        raise ImportError(f"{path.protocol}:// work directories: {exc}") from None
    return fs


# -- reading --------------------------------------------------------------------------------
def exists(path: Location) -> bool:
    if isinstance(path, RemotePath):
        return filesystem(path).exists(path.url)
    return path.exists()


def is_dir(path: Location) -> bool:
    """A folder locally; remotely, a prefix that holds at least one object."""
    if isinstance(path, RemotePath):
        fs = filesystem(path)
        fs.invalidate_cache(path.url)
        return fs.isdir(path.url)
    return path.is_dir()


def list_dir(path: Location) -> list[Location]:
    """The entries directly inside a folder, listed afresh (none when it does not exist)."""
    if isinstance(path, RemotePath):
        fs = filesystem(path)
        fs.invalidate_cache(path.url)  # in case LAIT_STORAGE_OPTIONS turned the cache on
        try:
            names = fs.ls(path.url, detail=False)
        except FileNotFoundError:
            return []
        return [path / n.rstrip("/").rsplit("/", 1)[-1] for n in names]
    if not path.is_dir():
        return []
    return list(path.iterdir())


def read_bytes(path: Location) -> bytes:
    if isinstance(path, RemotePath):
        return filesystem(path).cat_file(path.url)
    return path.read_bytes()


def read_text(path: Location) -> str:
    return read_bytes(path).decode("utf-8") if isinstance(path, RemotePath) else path.read_text()


def read_many(paths: list[Location]) -> list[bytes]:
    """The contents of several files, in order (remotely fetched concurrently)."""
    remote = [p for p in paths if isinstance(p, RemotePath)]
    got = _cat_by_url(filesystem(remote[0]), remote) if remote else {}
    return [got[p.url] if isinstance(p, RemotePath) else p.read_bytes() for p in paths]


def _cat_by_url(fs: Any, paths: list[RemotePath]) -> dict[str, bytes]:
    out = fs.cat([p.url for p in paths], on_error="raise")
    # fsspec keys the result by the path without protocol.
    by_key = {k.split("://", 1)[-1]: v for k, v in out.items()}
    return {p.url: by_key[p.url.split("://", 1)[1]] for p in paths}


def size(path: Location) -> int:
    if isinstance(path, RemotePath):
        return int(filesystem(path).size(path.url))
    return path.stat().st_size


def mtime_ns(path: Location) -> int | None:
    """A local file's modification time in nanoseconds (`os.stat`, not following a link); None
    on object storage, where an object is never changed in place and a copy (`rename_tree`)
    gets a new time of its own."""
    if isinstance(path, RemotePath):
        return None
    return os.lstat(path).st_mtime_ns


def sha256_of(path: Location) -> str:
    """Hex SHA-256 of a file's bytes, read in 8 MiB pieces."""
    import hashlib

    h = hashlib.sha256()
    with open_input(path) as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def open_input(path: Location) -> IO[bytes]:
    """A binary file to read sequentially (tar members, small files)."""
    if isinstance(path, RemotePath):
        return filesystem(path).open(path.url, "rb")
    return open(path, "rb")


def _parquet_source(path: Location) -> Any:
    if isinstance(path, RemotePath):
        # Parquet reads are a few exact ranges (footer, column chunks): no read-ahead, or the
        # unused columns of a media part would be downloaded too.
        return filesystem(path).open(path.url, "rb", cache_type="none")
    return path


def _is_corruption(exc: BaseException) -> bool:
    """Whether a Parquet read failed on the file's bytes (checksum, footer, page header), not
    on its absence, its permissions, the network or a full disk."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, ConnectionError, TimeoutError)):
        return False
    return isinstance(exc, (pa.ArrowInvalid, OSError)) and not errors.is_out_of_space(exc)


class CheckedParquetFile:
    """`pq.ParquetFile` whose reads verify every page's checksum (parts are written with them,
    see `lait.arrow_rows.writer_options`) and raise `CorruptPart` naming the file when its bytes are
    not what was written. Parts written before checksums simply have none to verify."""

    def __init__(self, path: Location):
        self.path = path
        try:
            self._file = pq.ParquetFile(_parquet_source(path), page_checksum_verification=True)
        except Exception as exc:
            if _is_corruption(exc):
                raise errors.corrupt(path, exc) from exc
            raise

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._file, name)
        if not callable(attr):
            return attr

        @functools.wraps(attr)
        def checked(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            except Exception as exc:
                if _is_corruption(exc):
                    raise errors.corrupt(self.path, exc) from exc
                raise
        return checked


def parquet_file(path: Location) -> CheckedParquetFile:
    return CheckedParquetFile(path)


def read_table(path: Location, **kwargs: Any) -> pa.Table:
    """`pyarrow.parquet.read_table` of one file (a native path locally), page checksums
    verified; a file whose bytes are not what was written raises `CorruptPart` naming it."""
    kwargs.setdefault("page_checksum_verification", True)
    try:
        return _read_table(path, **kwargs)
    except Exception as exc:
        if _is_corruption(exc):
            raise errors.corrupt(path, exc) from exc
        raise


def _read_table(path: Location, **kwargs: Any) -> pa.Table:
    if isinstance(path, RemotePath):
        # From a Python file object (every object-storage read), pyarrow 26's threaded read can
        # leave the last reference to a buffer Python's `read` returned on one of its pool
        # threads. If that thread drops it after the interpreter has begun to shut down, it
        # cannot take the GIL and the process aborts at exit ("terminate called without an
        # active exception"; gdb: `arrow::py::PyBuffer::~PyBuffer` on an Arrow pool thread).
        # That happened in 8 runs of 10 of a script reading a file 30 times. Read on one thread.
        kwargs.setdefault("use_threads", False)
        with _parquet_source(path) as f:
            return pq.read_table(f, **kwargs)
    return pq.read_table(path, **kwargs)


# -- writing --------------------------------------------------------------------------------
def cache_root() -> Path:
    """The folder lait keeps what it can rebuild in (hashes, built models): `$LAIT_CACHE`, else
    ~/.cache/lait. Nothing there is needed: a missing or damaged entry is built again."""
    return Path(os.environ.get("LAIT_CACHE") or Path.home() / ".cache" / "lait")


def make_dirs(path: Location) -> None:
    """Create a local folder; object storage has no folders, so nothing to do there."""
    if not isinstance(path, RemotePath):
        path.mkdir(parents=True, exist_ok=True)


def write_atomic(path: Location, data: bytes) -> None:
    """Write a file so that readers see either nothing or all of it."""
    if isinstance(path, RemotePath):
        filesystem(path).pipe_file(path.url, data)  # one PUT: visible only when complete
        return
    out = LocalOutput(path)
    try:
        out.stream().write(data)
    except BaseException as exc:
        out.discard()
        raise errors.on_write_error(exc, path) from exc
    out.commit()


def remove(path: Location) -> None:
    """Remove a file; a missing one is not an error."""
    if isinstance(path, RemotePath):
        try:
            filesystem(path).rm_file(path.url)
        except FileNotFoundError:
            pass
        return
    path.unlink(missing_ok=True)


def rename_tree(src: Location, dst: Location) -> None:
    """Move a folder to a name that does not exist yet: one rename locally; object by object
    on object storage, which has no folders to rename."""
    if isinstance(src, RemotePath):
        filesystem(src).mv(src.url, dst.url, recursive=True)
        return
    os.rename(src, dst)


def remove_tree(path: Location) -> None:
    """Remove a folder and everything in it; a missing one is not an error. A symbolic link is
    removed itself: nothing is ever removed through one (`shutil.rmtree` refuses a link, and
    with `ignore_errors` would leave it in place without a word)."""
    if isinstance(path, RemotePath):
        try:
            # Removes keys under `path/` only: `build_pick` never takes `build_pick2/` with it.
            filesystem(path).rm(path.url, recursive=True)
        except FileNotFoundError:
            pass
        return
    import shutil

    if path.is_symlink():
        path.unlink()
        return
    shutil.rmtree(path, ignore_errors=True)


_SYNC_FILE_RANGE_WRITE = 2  # start writeback of the dirty pages of the range, do not wait


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Ask the kernel to start writing a range of a file out now, without waiting for it: a
    large file written this way is mostly on disk by the time `commit` fsyncs it (the
    `bytes_per_sync` of databases). Nothing happens where the call does not exist (not Linux
    with glibc)."""
    libc = glibc()  # loaded once, with the memory settings' calls
    if libc is not None and hasattr(libc, "sync_file_range"):
        libc.sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # advisory: an error changes nothing


class LocalOutput:
    """A local file written under a hidden temporary name and renamed into place by `commit`."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = path.with_name(f".tmp-{uuid.uuid4().hex}-{path.name}")
        self._file: IO[bytes] | None = None

    @property
    def sink(self) -> Path:
        """Where a native writer (pyarrow) writes: the temporary path itself."""
        return self.tmp

    def stream(self, buffering: int = -1) -> IO[bytes]:
        """A Python file on the temporary path; `commit` flushes, fsyncs and closes it."""
        if self._file is None:
            self._file = open(self.tmp, "wb", buffering=buffering)
        return self._file

    def size(self) -> int:
        if self._file is not None:
            self._file.flush()
        return self.tmp.stat().st_size

    def commit(self) -> None:
        try:
            if self._file is not None:
                self._file.flush()
                os.fsync(self._file.fileno())
                self._file.close()
            os.replace(self.tmp, self.path)
        except OSError as exc:  # a full disk shows at the last flush: say which file, keep no half
            if not errors.is_out_of_space(exc):
                raise
            self.discard()
            raise errors.out_of_space(exc, self.path) from exc

    def discard(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:  # its buffered bytes could not be flushed (disk full): dropped anyway
                pass
        self.tmp.unlink(missing_ok=True)


class RemoteOutput:
    """An upload straight to the final key, visible only once `commit` completes it.

    The fsspec file is made unclosable until `commit`: its `__del__` (a writer dropped after an
    error, or at interpreter exit) would otherwise complete the upload of a partial file.
    """

    def __init__(self, path: RemotePath):
        from fsspec.spec import AbstractBufferedFile

        self.path = path
        self._file = filesystem(path).open(path.url, "wb")
        if not isinstance(self._file, AbstractBufferedFile):
            self._file.close()
            raise NotImplementedError(
                f"{path.protocol}:// cannot hold a work directory: lait needs object storage whose "
                "uploads appear only when complete (s3://, gs://, az://)")
        self._file._unclosable = True

    @property
    def sink(self) -> IO[bytes]:
        return self._file

    def stream(self, buffering: int = -1) -> IO[bytes]:
        return self._file  # fsspec buffers a block at a time itself

    def size(self) -> int:
        return self._file.tell()

    def commit(self) -> None:
        self._file._unclosable = False
        self._file.close()  # completes the PUT or the multipart upload

    def discard(self) -> None:
        try:
            self._file.discard()  # aborts a multipart upload that was started
        finally:
            self._file.closed = True  # so that nothing can upload it later


def open_output(path: Location) -> LocalOutput | RemoteOutput:
    """A file that appears at `path`, complete, on `commit`, and never if `discard`ed."""
    return RemoteOutput(path) if isinstance(path, RemotePath) else LocalOutput(path)
