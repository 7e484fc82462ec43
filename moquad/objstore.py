"""Where dataset bytes live: a local folder or an object-store URL (``s3://``, ``gs://``, ``http(s)://``).

One place turns a location into bytes: :func:`read_range` (a sample = ONE ranged GET on a store),
:func:`read_all` (``dataset.json``, manifests), :func:`size` (:func:`sizes`: many at once), :func:`listdir`,
plus :func:`upload` for ``moquad preprocess --out s3://...``. Object stores go through pyarrow's filesystems (pyarrow is
already a dependency, and its S3/GCS clients read credentials from the standard chain: environment,
``~/.aws``, instance roles; ``AWS_ENDPOINT_URL`` points at another S3-API server). http(s) is read-only,
through http.client on kept-alive connections (one per thread and server). Nothing here logs or stores a credential.

Failures a retry can cure (throttling, 5xx, timeouts, dropped connections, a body cut short: :class:`ShortBody`)
are retried with exponential backoff and jitter; each retry is logged and counted in :data:`STATS`. What stays
unreadable raises :class:`OSError` for the caller (the loader's bad-sample path). A server that answers a ranged
GET with the whole object (200, not 206) is a configuration error for the whole run (:class:`MoquadError`): every
sample would download its whole shard. An upload is whole under its name or absent (:func:`upload`): on S3 a
multipart upload to the final key, aborted on any failure; on GCS a temporary key moved into place.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import ipaddress
import logging
import os
import random
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from moquad.errors import MoquadError

log = logging.getLogger("moquad.objstore")
Location = str | Path
T = TypeVar("T")
SCHEMES = ("s3", "gs", "gcs", "http", "https")
ATTEMPTS = 6  # tries per request; backoff 0.1, 0.2, 0.4, 0.8, 1.6 s (+ jitter)
THREADS = 64  # concurrent requests per process: a batch's payloads and RAD donors, and the next batch's, in one wave
STATS = {"requests": 0, "retries": 0, "bytes": 0}  # this process's counts (each DataLoader worker has its own)
_NOT_RETRIED = ("ACCESS_DENIED", "AccessDenied", "NO_SUCH_BUCKET", "InvalidAccessKeyId", "SignatureDoesNotMatch",
               "past end of file")
_lock = threading.Lock()
_cache: dict[Any, Any] = {}  # (pid, kind, key) -> filesystem / open file; rebuilt after fork
_local = threading.local()  # this thread's open http(s) connections, {(pid, scheme, host): connection}


class ShortBody(ConnectionError):
    """A response body that ended before its length (a dropped connection mid-body): retried like one."""


def is_url(loc: Location) -> bool:
    """True for an object-store URL (``s3://``, ``gs://``, ``http(s)://``)."""
    return isinstance(loc, str) and urlsplit(loc).scheme in SCHEMES


def join(base: Location, *parts: str) -> Location:
    """``base / parts``: a Path for a folder, a URL string for a store."""
    if is_url(base):
        return "/".join([str(base).rstrip("/"), *(p.strip("/") for p in parts)])
    return Path(base).expanduser().joinpath(*parts)


def reset() -> None:
    """Forget this process's clients, open files and this thread's http(s) connections (after the store's objects,
    endpoint or proxy settings changed; the request threads are made anew with the pool)."""
    with _lock:
        _cache.clear()
    for (pid, *_), conn in getattr(_local, "conns", {}).items():
        if pid == os.getpid():
            conn.close()
    _local.conns = {}


def local_or(loc: Location, name: str) -> Path:
    """``loc / name`` for a folder; ``./name`` for a store URL (outputs are not written into the dataset)."""
    return Path(name) if is_url(loc) else Path(loc).expanduser() / name


def _cached(key: tuple, make: Callable[[], T]) -> T:
    """This process's object for ``key``, made once (``make`` may do network I/O: it runs outside the lock)."""
    key = (os.getpid(), *key)
    with _lock:
        if key in _cache:
            return _cache[key]
    value = make()
    with _lock:
        return _cache.setdefault(key, value)


def _before_fork() -> None:
    """Let this process's reads finish before it forks (a DataLoader starting its workers): the store clients'
    own locks would be copied held by a request in flight, and the child would hang in its first request."""
    pool = _cache.pop((os.getpid(), "pool"), None)  # a new pool is made on the next read
    if pool is not None:
        pool.shutdown(wait=True)  # the Futures complete: their results stay available


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # in case a thread of the parent held it at the fork


os.register_at_fork(before=_before_fork, after_in_child=_after_fork)


def _filesystem(scheme: str) -> Any:
    """pyarrow's S3 or GCS filesystem; credentials from the client's standard chain. S3: its own retries off
    (ours count them), ``AWS_ENDPOINT_URL(_S3)`` for another S3-API server. GCS: ``STORAGE_EMULATOR_HOST`` (the
    variable Google's clients read) points at an emulator, without credentials."""
    import pyarrow.fs as pafs

    def make() -> Any:
        if scheme == "s3":
            endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            return pafs.S3FileSystem(endpoint_override=endpoint, connect_timeout=10, request_timeout=60,
                                     retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
        emulator = os.environ.get("STORAGE_EMULATOR_HOST")
        if emulator:
            host = urlsplit(emulator if "://" in emulator else f"http://{emulator}")
            return pafs.GcsFileSystem(anonymous=True, endpoint_override=host.netloc, scheme=host.scheme,
                                      project_id=os.environ.get("GOOGLE_CLOUD_PROJECT", "moquad"),
                                      retry_time_limit=timedelta(seconds=1))
        return pafs.GcsFileSystem()
    return _cached(("fs", scheme), make)


def _split(url: str) -> tuple[Any, str]:
    u = urlsplit(url)
    return _filesystem("gs" if u.scheme == "gcs" else u.scheme), f"{u.netloc}{u.path}"


def _retryable(e: BaseException) -> bool:
    if isinstance(e, FileNotFoundError | PermissionError | IsADirectoryError | Refused):
        return False
    if isinstance(e, urllib.error.HTTPError):
        return e.code in (408, 429) or e.code >= 500
    return isinstance(e, OSError) and not any(s in str(e) for s in _NOT_RETRIED)


def with_retries(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, retried with exponential backoff on transient failures; each retry logged and counted."""
    for attempt in range(ATTEMPTS):
        try:
            with _lock:
                STATS["requests"] += 1
            return fn()
        except OSError as e:
            if not _retryable(e) or attempt == ATTEMPTS - 1:
                raise
            with _lock:
                STATS["retries"] += 1
                n = STATS["retries"]
            log.warning("retry %d of %s after %s: %s (%d retries so far)", attempt + 1, what, type(e).__name__,
                        str(e).splitlines()[0][:200], n)
            time.sleep(min(5.0, 0.1 * 2**attempt) * (0.5 + random.random()))
    raise AssertionError("unreachable")


_REDIRECTS = (301, 302, 303, 307, 308)


def _connection(u: Any, fresh: bool = False) -> tuple[http.client.HTTPConnection, bool]:
    """(this thread's kept-alive connection to ``u``'s server (a proxy's, when the environment names one for it),
    whether it was kept from an earlier request): made on first use or when ``fresh``. Keyed by process too: a
    forked worker never uses its parent's sockets. Through a proxy, a plain http request names the whole URL and an
    https one goes through a CONNECT tunnel; either carries the proxy's credentials (:func:`_proxy`)."""
    conns = getattr(_local, "conns", None)
    if conns is None:
        conns = _local.conns = {}
    key = (os.getpid(), u.scheme, u.netloc)
    if key in conns and not fresh:
        return conns[key], True
    for k in [k for k in conns if k[0] != key[0] or k == key]:  # a parent's (never closed here: not ours) or stale
        old = conns.pop(k)
        if k[0] == key[0]:
            old.close()
    proxy, auth = _proxy(u)
    if proxy is None:
        conn = (http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection)(
            u.hostname, u.port, timeout=60)
    elif u.scheme == "https":
        conn = http.client.HTTPSConnection(proxy.hostname, proxy.port or 80, timeout=60)  # TLS inside the tunnel
        conn.set_tunnel(u.hostname, u.port, headers=auth)
    else:
        conn = http.client.HTTPConnection(proxy.hostname, proxy.port or 80, timeout=60)
    conn.absolute = proxy is not None and u.scheme == "http"  # a plain http proxy is sent the whole URL ...
    conn.proxy_headers = auth if conn.absolute else {}  # ... and its credentials with every request
    conn.proxy_name = f"{proxy.hostname}:{proxy.port or 80}" if proxy else ""
    conns[key] = conn
    return conn, False


def _proxy(u: Any) -> tuple[Any, dict[str, str]]:
    """(the proxy the environment names for ``u`` (``http_proxy`` / ``https_proxy``, as urllib reads them), None
    when none or ``no_proxy`` exempts ``u``; the headers it needs: ``Proxy-Authorization: Basic`` from the user and
    password in its URL, percent-decoded as urllib does)."""
    proxies = urllib.request.getproxies()
    url = proxies.get(u.scheme)
    if not url or _bypassed(u, proxies.get("no", "")):
        return None, {}
    proxy = urlsplit(url if "://" in url else f"http://{url}")
    if proxy.username is None:
        return proxy, {}
    user_pass = f"{urllib.parse.unquote(proxy.username)}:{urllib.parse.unquote(proxy.password or '')}"
    return proxy, {"Proxy-Authorization": "Basic " + base64.b64encode(user_pass.encode()).decode("ascii")}


def _bypassed(u: Any, no_proxy: str) -> bool:
    """Whether ``no_proxy`` (comma or space separated) sends ``u`` direct, matched as urllib and requests match it:
    ``*`` sends everything direct; ``host`` or ``.domain`` (``*.domain``) matches it and its subdomains on any port,
    ``host:port`` on that port only (the scheme's default when the URL names none); ``10.0.0.0/8`` an IP network."""
    host = (u.hostname or "").lower()
    port = u.port or (443 if u.scheme == "https" else 80)
    for entry in re.split(r"[,\s]+", no_proxy.lower()):
        if entry == "*":
            return True
        name, want = entry, None
        if entry.startswith("[") and "]" in entry:  # [v6]:port
            name, _, rest = entry[1:].partition("]")
            want = rest.lstrip(":") or None
        elif entry.count(":") == 1:
            name, want = entry.split(":")
        if not name or (want is not None and want != str(port)):
            continue
        if "/" in name:
            with contextlib.suppress(ValueError):
                if ipaddress.ip_address(host) in ipaddress.ip_network(name, strict=False):
                    return True
            continue
        name = name.lstrip("*").lstrip(".")
        if host == name or host.endswith(f".{name}"):
            return True
    return False


def _exchange(url: str, method: str, headers: dict[str, str]) -> tuple[int, Any, bytes]:
    """One request on this thread's kept-alive connection -> (status, headers, whole body; b"" for HEAD). A kept
    connection the server closed while idle is replaced once, at no retry's cost; any other failure drops the
    connection (its state is unknown) and is raised for :func:`with_retries`."""
    u = urlsplit(url)
    for fresh in (False, True):
        conn, reused = _connection(u, fresh)
        path = url if conn.absolute else (u.path or "/") + (f"?{u.query}" if u.query else "")
        try:
            conn.request(method, path, headers={**conn.proxy_headers, **headers})
            r = conn.getresponse()
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            conn.close()
            if reused:
                continue  # the server had closed the idle connection: once more on a new one
            raise
        except BaseException as e:
            conn.close()
            if isinstance(e, OSError) and str(e).startswith("Tunnel connection failed: 407"):  # the CONNECT's answer
                raise _proxy_refused(conn.proxy_name) from None
            raise
        if r.status == 200 and "Range" in headers:  # the whole object instead of the range: not read (the caller
            conn.close()  # stops the run), the connection dropped mid-body
            return r.status, r.headers, b""
        try:
            body = _body(r, url)
        except BaseException:
            conn.close()
            raise
        if r.will_close:
            conn.close()
        return r.status, r.headers, body
    raise AssertionError("unreachable")


def _http(url: str, offset: int | None = None, size: int | None = None, method: str = "GET") -> tuple[int, Any, bytes]:
    """(status, headers, body) of a GET (ranged when ``offset`` and ``size`` are given) or HEAD of ``url``, over
    kept-alive connections (one TCP and TLS set-up per thread and server, not per request); redirects followed. An
    error status raises ``urllib.error.HTTPError`` (a 401/403: :class:`MoquadError`, one line)."""
    headers = {"Range": f"bytes={offset}-{offset + size - 1}"} if offset is not None and size is not None else {}
    for _ in range(5):
        status, hdrs, body = _exchange(url, method, headers)
        if status not in _REDIRECTS or "Location" not in hdrs:
            break
        url = urllib.parse.urljoin(url, hdrs["Location"])
    if status == 407:
        proxy = _proxy(urlsplit(url))[0]
        raise _proxy_refused(f"{proxy.hostname}:{proxy.port or 80}" if proxy else urlsplit(url).netloc)
    if status in (401, 403):
        raise MoquadError(f"access denied (HTTP {status}) for {url}; check the URL and that the server lets "
                          "you read it")
    if status >= 400:
        raise urllib.error.HTTPError(url, status, http.client.responses.get(status, ""), hdrs, None)
    return status, hdrs, body


def _proxy_refused(proxy: str) -> MoquadError:
    """HTTP 407: the proxy wants credentials it did not get (or refused them); never names them."""
    return MoquadError(f"the proxy ({proxy}) asks for credentials (HTTP 407); give them in its URL: "
                       "http_proxy / https_proxy=http://USER:PASSWORD@HOST:PORT (special characters percent-encoded)")


def _body(r: Any, url: str) -> bytes:
    """The whole body of response ``r`` (its declared length), else :class:`ShortBody`."""
    try:
        data = r.read()
    except http.client.IncompleteRead as e:  # not an OSError: it would escape the retries and the bad-sample path
        raise ShortBody(f"{url}: the response ended after {len(e.partial)} bytes, "
                        f"{e.expected} more were expected") from None
    return data


def read_range(loc: Location, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset``: one ``pread`` locally, ONE ranged GET on a store (file handles cached)."""
    if size == 0:
        return b""
    if not is_url(loc):
        with open(loc, "rb", buffering=0) as f:
            return os.pread(f.fileno(), size, offset)
    url = str(loc)

    def get() -> bytes:
        if urlsplit(url).scheme in ("http", "https"):
            status, _, body = _http(url, offset, size)
            if status != 206:
                raise MoquadError(f"{url} answered a ranged GET with HTTP {status} and the whole object, not "
                                  "206 and the range: every sample would download its whole shard; serve the "
                                  "dataset with a server that honours Range (nginx, any object store)")
            if len(body) != size:
                raise ShortBody(f"{url}: {len(body)} bytes in the response, {size} asked for")
            return body
        fs, path = _split(url)
        f = _cached(("file", url), lambda: fs.open_input_file(path))  # its HEAD happens once per process
        return f.read_at(size, offset)
    data = with_retries(f"read {url} [{offset}, +{size})", get)
    with _lock:
        STATS["bytes"] += len(data)
    return data


def _caught(fn: Callable[[Any], T], x: Any) -> T | Exception:
    try:
        return fn(x)
    except Exception as e:  # noqa: BLE001 - handed back to the caller per item
        return e


def start(fn: Callable[[Any], T], items: Sequence[Any]) -> list[Future]:
    """``fn`` over ``items`` on this process's request threads, started now (the caller goes on); each Future's
    result is ``fn``'s value or the exception it raised."""
    pool = _cached(("pool",), lambda: ThreadPoolExecutor(THREADS, thread_name_prefix="moquad-read"))
    return [pool.submit(_caught, fn, x) for x in items]


def concurrently(fn: Callable[[Any], T], items: Sequence[Any]) -> list[T | Exception]:
    """``fn`` over ``items`` on this process's request threads (a store's latency overlaps); failures returned."""
    if len(items) < 2:
        return [_caught(fn, x) for x in items]
    return [f.result() for f in start(fn, items)]


def read_all(loc: Location) -> bytes:
    """A whole (small) object or file; a missing one raises FileNotFoundError."""
    if not is_url(loc):
        return Path(loc).read_bytes()
    url = str(loc)

    def get() -> bytes:
        if urlsplit(url).scheme in ("http", "https"):
            try:
                return _http(url)[2]
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    raise FileNotFoundError(url) from None
                raise
        fs, path = _split(url)
        with fs.open_input_stream(path) as f:
            return f.read()
    return with_retries(f"read {url}", get)


def exists(loc: Location) -> bool:
    return size(loc) is not None


def size(loc: Location) -> int | None:
    """Bytes of a file/object, None when absent."""
    if not is_url(loc):
        p = Path(loc)
        return p.stat().st_size if p.is_file() else None
    url = str(loc)
    if urlsplit(url).scheme in ("http", "https"):
        try:
            _, headers, _ = with_retries(f"head {url}", lambda: _http(url, method="HEAD"))
            return int(headers.get("Content-Length", 0))
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                return None
            raise  # a 5xx that stayed after the retries is not a missing file
    import pyarrow.fs as pafs

    fs, path = _split(url)
    info = with_retries(f"stat {url}", lambda: fs.get_file_info(path))
    return info.size if info.type == pafs.FileType.File else None


def sizes(locs: Sequence[Location]) -> list[int | None]:
    """:func:`size` of several files/objects; on a store the requests run concurrently, so a dataset of many
    shards on http(s) (one HEAD each: it cannot list) starts in about one round trip, not one per shard."""
    if not any(is_url(loc) for loc in locs):
        return [size(loc) for loc in locs]
    out = concurrently(size, list(locs))
    for r in out:
        if isinstance(r, Exception):
            raise r
    return out  # type: ignore[return-value]


def listdir(loc: Location) -> dict[str, int]:
    """Names -> sizes of the files directly in a folder / under a prefix (empty when absent; http cannot list)."""
    if not is_url(loc):
        p = Path(loc)
        return {f.name: f.stat().st_size for f in p.iterdir() if f.is_file()} if p.is_dir() else {}
    url = str(loc)
    if urlsplit(url).scheme in ("http", "https"):
        return {}
    import pyarrow.fs as pafs

    fs, path = _split(url)
    sel = pafs.FileSelector(path.rstrip("/"), allow_not_found=True)
    infos = with_retries(f"list {url}", lambda: fs.get_file_info(sel))
    return {i.base_name: i.size for i in infos if i.type == pafs.FileType.File}


def arrow_copy(raw: bytes) -> Any:
    """A copy of ``raw`` in memory Arrow owns (a ``pyarrow.Buffer``), for Arrow to read or send bytes Python holds.

    Arrow's pool threads may drop the last reference to a read's source (or an upload's part) after the call
    returns. Dropping one that wraps a Python object takes the GIL, and CPython ends a thread that asks for the
    GIL while the interpreter exits by unwinding it through a noexcept destructor: the process aborts at exit
    (SIGABRT, "terminate called without an active exception"; apache/arrow#34314). A copy Arrow owns is released
    without Python.
    """
    import pyarrow as pa

    sink = pa.BufferOutputStream()
    sink.write(raw)
    return sink.getvalue()


PART_BYTES = 32 << 20  # an S3 upload's part (S3: 5 MiB to 5 GiB, at most 10,000 parts: bigger for files over 312 GiB)
PARTS_IN_FLIGHT = 4  # parts sent at once per upload (memory: about 5 parts)


def upload(local: Path, url: str) -> None:
    """Copy a finished local file to ``url``: whole under that name, or not at all (a name that held a whole object
    before keeps it).

    s3:// (:func:`_upload_s3`): written to its final key directly, each byte sent once and never copied, so no size
    cap below S3's 5 TB. gs://: pyarrow's GCS stream completes its upload when it is closed, even by an exception,
    and cannot abort it, so the bytes go to a temporary key moved to ``url`` after the last byte (a copy inside the
    bucket, which GCS does without a size cap) and deleted on any failure.
    """
    scheme = urlsplit(url).scheme
    if scheme in ("http", "https"):
        raise OSError(f"{url}: http(s) is read-only; write to s3:// or gs://")
    try:
        (_upload_s3 if scheme == "s3" else _upload_gcs)(local, url)
    except OSError as e:  # what the retries did not cure (or a refusal): one line, never a credential
        raise MoquadError(f"cannot upload {url} ({str(e).splitlines()[0][:300]}); check the URL, the network and "
                          "the store's credentials (standard environment / config chain), then re-run the same "
                          "command to resume") from None


def _upload_gcs(local: Path, url: str) -> None:
    fs, path = _split(url)
    temp = f"{path}.partial-{uuid.uuid4().hex[:12]}"

    def put() -> None:
        with open(local, "rb") as src, fs.open_output_stream(temp) as dst:
            while chunk := src.read(1 << 24):
                dst.write(arrow_copy(chunk))  # parts are sent in the background, by Arrow's threads
        fs.move(temp, path)
    try:
        with_retries(f"upload {url}", put)
    except BaseException:
        with contextlib.suppress(Exception):
            fs.delete_file(temp)
        raise


def _upload_s3(local: Path, url: str) -> None:
    """``local`` to s3:// ``url``: ONE PutObject up to :data:`PART_BYTES`, else a multipart upload to the final key,
    aborted on any failure (an exception, Ctrl-C, a part that stays refused). S3 shows an object only once its upload
    completes, so no partial object ever appears, even when the process is killed (its parts then wait for the
    bucket's AbortIncompleteMultipartUpload rule). boto3, because pyarrow's S3 stream cannot abort: closing it, even
    from an exception or its destructor, completes the upload with the bytes written so far (apache/arrow#40502)."""
    u = urlsplit(url)
    bucket, key, client = u.netloc, u.path.lstrip("/"), _s3_client()
    part = max(PART_BYTES, -(-os.path.getsize(local) // 10_000))
    with open(local, "rb") as src:
        first = src.read(part)
        rest = src.read(part)
        if not rest:
            _s3_call(f"upload {url}", lambda: client.put_object(Bucket=bucket, Key=key, Body=first))
            return
        start = _s3_call(f"start upload {url}", lambda: client.create_multipart_upload(
            Bucket=bucket, Key=key, ContentType="application/octet-stream"))
        target = {"Bucket": bucket, "Key": key, "UploadId": start["UploadId"]}
        try:
            parts = _send_parts(client, url, target, src, [first, rest], part)
            _s3_call(f"complete upload {url}", lambda: client.complete_multipart_upload(
                **target, MultipartUpload={"Parts": parts}))
        except BaseException:
            with contextlib.suppress(Exception):
                _s3_call(f"abort upload {url}", lambda: client.abort_multipart_upload(**target))
            raise


def _send_parts(client: Any, url: str, target: dict, src: Any, read: list[bytes], part: int) -> list[dict]:
    """The parts of a multipart upload: ``read``, then the rest of ``src`` in ``part``-byte reads, sent
    :data:`PARTS_IN_FLIGHT` at a time; their numbers and ETags, in order. On a failure no part is left in flight (an
    abort that ran before a part landed would leave that part behind)."""
    from concurrent.futures import FIRST_COMPLETED, wait

    def send(number: int, body: bytes) -> dict:
        got = _s3_call(f"upload part {number} of {url}", lambda: client.upload_part(
            **target, PartNumber=number, Body=body))
        return {"PartNumber": number, "ETag": got["ETag"]}
    pool = ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="moquad-upload")
    done: list[dict] = []
    flying: set[Future] = set()
    try:
        number = 0
        while chunk := (read.pop(0) if read else src.read(part)):
            number += 1
            flying.add(pool.submit(send, number, chunk))
            if len(flying) >= PARTS_IN_FLIGHT:
                finished, flying = wait(flying, return_when=FIRST_COMPLETED)
                done += [f.result() for f in finished]
        done += [f.result() for f in flying]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return sorted(done, key=lambda p: p["PartNumber"])


def _s3_client() -> Any:
    """This process's boto3 S3 client: credentials from the standard chain, ``AWS_ENDPOINT_URL(_S3)`` for another
    S3-API server (path-style addressing there, as pyarrow's), the proxy environment as boto3 reads it; its own
    retries off (:func:`_s3_call` counts them)."""
    try:
        import boto3
        from botocore.config import Config
    except ImportError:
        raise MoquadError("writing to s3:// needs boto3 (pip install boto3)") from None
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    config = Config(connect_timeout=10, read_timeout=60, retries={"max_attempts": 1, "mode": "standard"},
                    max_pool_connections=PARTS_IN_FLIGHT + 2, request_checksum_calculation="when_required",
                    response_checksum_validation="when_required", s3={"addressing_style": "path"} if endpoint else {})
    return _cached(("boto3-s3", endpoint), lambda: boto3.session.Session().client(
        "s3", endpoint_url=endpoint, config=config))


class Refused(OSError):
    """A request the server refused for a reason a retry cannot cure (access, a missing bucket, bad input)."""


def _s3_call(what: str, fn: Callable[[], T]) -> T:
    """``fn()``, one boto3 S3 request, with :func:`with_retries`; botocore's errors as OSErrors its rule reads:
    throttling, 5xx and dropped connections retried, the rest :class:`Refused`."""
    from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
    from botocore.exceptions import ConnectionError as BotoConnectionError

    def call() -> T:
        try:
            return fn()
        except ClientError as e:
            err, meta = e.response.get("Error", {}), e.response.get("ResponseMetadata", {})
            status, code = int(meta.get("HTTPStatusCode") or 0), str(err.get("Code", ""))
            text = f"{code or status}: {err.get('Message', '')}"
            if status in (408, 429) or status >= 500 or code in ("SlowDown", "Throttling", "RequestTimeout"):
                raise ConnectionError(text) from None
            raise Refused(text) from None
        except (BotoConnectionError, HTTPClientError) as e:
            raise ConnectionError(str(e)) from None
        except BotoCoreError as e:  # no credentials, a bad endpoint URL: the configuration's
            raise Refused(str(e)) from None
    return with_retries(what, call)


def download(url: str, local: Path) -> None:
    """Copy an object to a local file (atomically)."""
    from moquad.io import atomic_write_bytes

    atomic_write_bytes(local, read_all(url))
