"""A real S3-API server on 127.0.0.1 for tests and benchmarks: moto's server mode behind a small proxy.

The proxy forwards every request unchanged and can (a) add latency to each sample read, (b) answer
503 SlowDown or drop the connection on a fraction of sample reads, (c) fail every read of one byte
range for good, (d) refuse a CopyObject over a size (S3's 5 GiB cap, scaled down) or every upload of one part
number of a multipart upload; it counts copies and the bytes uploaded. It counts the sample reads (ranged GETs of shards) and their bytes, independently of moquad.
For benchmarks: :func:`nginx_server` (a server that is not the bottleneck: nginx, if installed) and
:func:`proxy_process` (a light latency proxy in a process of its own).
"""

from __future__ import annotations

import contextlib
import functools
import getpass
import http.client
import io
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

SECRET = "moquad-test-secret-Zq8"  # must never show up in a run folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    """Until a server listens on 127.0.0.1:``port`` (raises after ``timeout`` seconds)."""
    deadline = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)


class FaultProxy(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # listen backlog: at socketserver's 5, a burst of 32 connects loses SYNs (1 s retries)

    def __init__(self, upstream: int):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.upstream = upstream
        self.latency = 0.0  # seconds added to each ranged GET (to every request with ``latency_all``)
        self.latency_all = False
        self.fail_every = 0  # every n-th ranged GET: 503 (odd faults) or a dropped connection (even faults)
        self.always_fail: str | None = None  # "SHARD-NAME bytes=A-B": that range of that shard always gets 503
        self.copy_limit: int | None = None  # a CopyObject of a bigger source is refused, as S3 refuses one over 5 GiB
        self.fail_part: int | None = None  # every upload of this part number of a multipart upload answers 500
        self.lock = threading.Lock()
        self.ranged = self.ranged_bytes = self.faults = self.slowdowns = 0
        self.copies = self.put_bytes = 0  # CopyObject requests; body bytes of the other PUTs (objects and parts)
        self.in_flight = self.max_in_flight = 0  # requests inside their added latency now / at most at once

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def reset(self) -> None:
        with self.lock:
            self.ranged = self.ranged_bytes = self.faults = self.slowdowns = 0
            self.copies = self.put_bytes = 0


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: FaultProxy

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # no Nagle stall per response

    def log_message(self, *args: object) -> None:
        pass

    def _fault(self) -> str | None:
        srv = self.server
        rng = self.headers.get("Range")
        sample = self.command == "GET" and rng is not None and "/shards/" in self.path
        if srv.latency and (sample or srv.latency_all):
            with srv.lock:
                srv.in_flight += 1
                srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            time.sleep(srv.latency)
            with srv.lock:
                srv.in_flight -= 1
        if not sample:
            return None
        with srv.lock:
            srv.ranged += 1
            if srv.always_fail is not None and f"{self.path.rsplit('/', 1)[-1]} {rng}" == srv.always_fail:
                srv.faults += 1
                return "503"
            if srv.fail_every and srv.ranged % srv.fail_every == 0:
                srv.faults += 1
                srv.slowdowns += srv.faults % 2
                return "503" if srv.faults % 2 else "drop"
        return None

    def _upload_rule(self, body: bytes | None) -> tuple[int, str, str] | None:
        """Counts the upload requests, and refuses what S3 would (scaled down) or what the test orders: (status,
        code, message) of the refusal, else None."""
        srv = self.server
        if self.command != "PUT":
            return None
        source = self.headers.get("x-amz-copy-source")
        with srv.lock:
            srv.copies += source is not None
            srv.put_bytes += 0 if source is not None else len(body or b"")
        if source is not None and srv.copy_limit is not None:
            probe = http.client.HTTPConnection("127.0.0.1", srv.upstream, timeout=60)
            probe.request("HEAD", "/" + source.lstrip("/").split("?")[0])
            size = int(probe.getresponse().getheader("Content-Length") or 0)
            probe.close()
            if size > srv.copy_limit:
                return 400, "InvalidRequest", ("The specified copy source is larger than the maximum allowable size "
                                               f"for a copy source: {srv.copy_limit}")
        if srv.fail_part is not None and parse_qs(urlsplit(self.path).query).get("partNumber") == [str(srv.fail_part)]:
            return 500, "InternalError", "We encountered an internal error. Please try again."
        return None

    def _body(self) -> bytes | None:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while (n := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                chunks.append(self.rfile.read(n))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _forward(self) -> None:
        body = self._body()
        refused = self._upload_rule(body)
        if refused is not None:
            status, code, message = refused
            msg = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        fault = self._fault()
        if fault == "drop":
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if fault == "503":
            msg = b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>"
            self.send_response(503)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(msg)))
            self.end_headers()
            self.wfile.write(msg)
            return
        conn = http.client.HTTPConnection("127.0.0.1", self.server.upstream, timeout=60)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("connection", "transfer-encoding")}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if self.headers.get("Range") and self.command == "GET" and "/shards/" in self.path:
            with self.server.lock:
                self.server.ranged_bytes += len(data)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("connection", "transfer-encoding", "content-length", "server", "date"):
                self.send_header(k, v)
        self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD"
                         else str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _forward


@contextlib.contextmanager
def s3_server(bucket: str = "bkt") -> Iterator[FaultProxy]:
    """moto's S3 server + the proxy; the process environment points AWS clients at the proxy meanwhile."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proxy = FaultProxy(port)
    proxy.server_pid = proc.pid  # benchmarks read the server's CPU time
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": proxy.url, "AWS_EC2_METADATA_DISABLED": "true"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        wait_for_port(port)
        import pyarrow.fs as pafs

        pafs.S3FileSystem(endpoint_override=proxy.url, allow_bucket_creation=True).create_dir(bucket)
        yield proxy
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proxy.shutdown()
        proc.terminate()
        proc.wait(10)


class _FileHandler(SimpleHTTPRequestHandler):
    """A static HTTP/1.1 file server (connections kept alive) that honours a single ``Range`` (206), unlike Python's
    own, with faults to order: ``server.mode`` "ignore-range" (200 and the whole file, as a server without Range
    support answers), "forbid" (403 to everything), "close-idle" (each connection closed after one reply without
    saying so, as a server closes idle kept-alive connections); ``server.truncate`` = n: the next n ranged replies
    stop at half their body. ``server.connections`` counts the TCP connections accepted, ``server.absolute`` the
    requests that named a whole URL (as a client sends them to a proxy: this server then acts as one). As a proxy it
can want credentials (``server.proxy_auth``: the ``Proxy-Authorization`` value it accepts, else 407; ``refused``
counts the 407s) and open CONNECT tunnels (to 127.0.0.1:``server.tunnel_to`` whatever host they name;
``server.tunnels`` lists each CONNECT's target and credentials), as an https client asks for them."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, *args: object) -> None:
        pass

    def translate_path(self, path: str) -> str:  # a proxy's request names the whole URL (absolute form)
        if "://" in path:
            with self.server.lock:
                self.server.absolute += 1
            path = urlsplit(path).path
        return super().translate_path(path)

    def _refused(self) -> bool:
        """407 unless the request carries the credentials ``server.proxy_auth`` (when it wants any)."""
        srv = self.server
        if srv.proxy_auth is None or self.headers.get("Proxy-Authorization") == srv.proxy_auth:
            return False
        with srv.lock:
            srv.refused += 1
        body = b"proxy credentials required"
        self.send_response(407)
        self.send_header("Proxy-Authenticate", 'Basic realm="moquad-test"')
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        return True

    def do_CONNECT(self) -> None:  # noqa: N802 - http.server's naming
        srv = self.server
        with srv.lock:
            srv.tunnels.append((self.path, self.headers.get("Proxy-Authorization")))
        if self._refused():
            self.close_connection = True
            return
        upstream = socket.create_connection(("127.0.0.1", srv.tunnel_to), timeout=30)
        self.send_response(200, "Connection established")
        self.end_headers()
        self.close_connection = True
        try:
            while True:
                ready, _, _ = select.select([self.connection, upstream], [], [], 30)
                data = ready[0].recv(1 << 16) if ready else b""
                if not data:
                    return
                (upstream if ready[0] is self.connection else self.connection).sendall(data)
        except OSError:
            return
        finally:
            upstream.close()

    def end_headers(self) -> None:
        super().end_headers()
        if self.server.mode == "close-idle":
            self.close_connection = True  # no "Connection: close" sent: the client believes it is kept

    def send_head(self):  # noqa: ANN201 - http.server's own signature
        srv, rng = self.server, self.headers.get("Range")
        if "://" in self.path and self._refused():
            return None
        if srv.mode == "forbid":
            self.send_error(403)
            return None
        if rng is None or srv.mode == "ignore-range" or not os.path.isfile(self.translate_path(self.path)):
            return super().send_head()
        with open(self.translate_path(self.path), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            first, last = (int(x) for x in rng.removeprefix("bytes=").split("-"))
            last = min(last, size - 1)
            f.seek(first)
            data = f.read(last - first + 1)
        self.send_response(206)
        self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with srv.lock:
            cut, srv.truncate = srv.truncate > 0, max(0, srv.truncate - 1)
        if cut:
            self.close_connection = True
            data = data[: len(data) // 2]
        return io.BytesIO(data)


def _file_server(directory: str | os.PathLike) -> ThreadingHTTPServer:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_FileHandler, directory=str(directory)))
    srv.daemon_threads = True
    srv.mode, srv.truncate, srv.lock, srv.connections, srv.absolute = "ok", 0, threading.Lock(), 0, 0
    srv.proxy_auth, srv.refused, srv.tunnel_to, srv.tunnels = None, 0, None, []
    return srv


@contextlib.contextmanager
def _serving(srv: ThreadingHTTPServer, scheme: str) -> Iterator[ThreadingHTTPServer]:
    srv.url = f"{scheme}://127.0.0.1:{srv.server_address[1]}"
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.shutdown()


@contextlib.contextmanager
def http_server(directory: str | os.PathLike) -> Iterator[ThreadingHTTPServer]:
    """``directory`` served over http:// on 127.0.0.1 by :class:`_FileHandler`; ``srv.url`` is its root."""
    with _serving(_file_server(directory), "http") as srv:
        yield srv


@contextlib.contextmanager
def https_server(directory: str | os.PathLike, hostname: str = "dataset.invalid") -> Iterator[ThreadingHTTPServer]:
    """``directory`` served over https:// on 127.0.0.1 with a self-signed certificate for ``hostname`` (made by the
    ``openssl`` command); ``srv.cert`` is the certificate a client must trust (``SSL_CERT_FILE``)."""
    import ssl

    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("the https test server needs the openssl command")
    with tempfile.TemporaryDirectory(prefix="moquad-tls-") as tmp:
        cert, key = f"{tmp}/cert.pem", f"{tmp}/key.pem"
        subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                        f"/CN={hostname}", "-addext", f"subjectAltName=DNS:{hostname},IP:127.0.0.1", "-keyout", key,
                        "-out", cert], check=True, capture_output=True, timeout=60)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(cert, key)
        srv = _file_server(directory)
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
        srv.cert = cert
        with _serving(srv, "https") as srv:
            yield srv


NGINX_MISSING = ("nginx not found (PATH, /usr/sbin): no nginx rows (for the benchmark only: apt-get install -y "
                 "nginx-light, or nginx)")
NGINX_CONF = """daemon off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
{user}
events {{ worker_connections 1024; }}
http {{
    log_format sent '$status $body_bytes_sent $request_method $uri "$http_range"';
    access_log {tmp}/access.log sent;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    default_type application/octet-stream;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 100000;
    server {{
        listen 127.0.0.1:{port};
        root {root};
    }}
}}
"""


def nginx_exe() -> str | None:
    """nginx on PATH, else Debian's /usr/sbin/nginx (not on a plain user's PATH); None when not installed."""
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)


@contextlib.contextmanager
def nginx_server(directory: str | os.PathLike) -> Iterator[subprocess.Popen]:
    """``directory`` served by nginx (static files, Range built in) on 127.0.0.1, in the foreground as this
    user, from a generated config in a temp folder (its own pid and logs); ``proc.url`` is its root and
    ``proc.ranged_bytes()`` the body bytes of the 206 replies it logged. Needs nginx (:func:`nginx_exe`)."""
    exe = nginx_exe()
    if exe is None:
        raise FileNotFoundError(NGINX_MISSING)
    with tempfile.TemporaryDirectory(prefix="moquad-nginx-") as tmp:
        port = free_port()
        user = f"user {getpass.getuser()};" if os.geteuid() == 0 else ""  # root's workers would run as nobody
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=port, root=Path(directory).resolve(), user=user))
        proc = subprocess.Popen([exe, "-p", tmp, "-c", str(conf), "-e", f"{tmp}/error.log"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc.url = f"http://127.0.0.1:{port}"
        proc.ranged_bytes = lambda: sum(int(line.split()[1]) for line in (Path(tmp) / "access.log").read_text()
                                        .splitlines() if line.startswith("206 "))
        try:
            wait_for_port(port)
            yield proc
        finally:
            proc.terminate()
            proc.wait(10)


@contextlib.contextmanager
def proxy_process(upstream: int, latency: float) -> Iterator[subprocess.Popen]:
    """:func:`serve_latency` in its own process (its CPU and GIL apart from the caller's): ``latency`` seconds added
    to EVERY request forwarded to 127.0.0.1:``upstream``; ``proc.url`` is its root."""
    proc = subprocess.Popen([sys.executable, __file__, "proxy", str(upstream), str(latency)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        proc.url = proc.stdout.readline().strip()
        if not proc.url.startswith("http://"):
            raise RuntimeError(f"the latency proxy did not start (exit {proc.poll()})")
        yield proc
    finally:
        proc.terminate()
        proc.wait(10)


async def _relay_one(reader, writer, upstream: int, latency: float) -> bool:  # noqa: ANN001 - asyncio streams
    """One request (GET or HEAD: no body) from ``reader`` to a new upstream connection after ``latency``; its reply
    (headers, then Content-Length bytes copied in large chunks, not parsed) back. False at the client's EOF."""
    import asyncio

    head = await reader.readuntil(b"\r\n\r\n")
    await asyncio.sleep(latency)
    up_r, up_w = await asyncio.open_connection("127.0.0.1", upstream)
    up_w.write(head)
    reply = await up_r.readuntil(b"\r\n\r\n")
    writer.write(reply)
    lines = reply.decode("latin-1").lower().split("\r\n")
    left = 0 if head.startswith(b"HEAD ") else \
        next((int(x.split(":", 1)[1]) for x in lines if x.startswith("content-length:")), 0)
    while left > 0:
        chunk = await up_r.read(min(left, 1 << 20))
        if not chunk:
            break
        left -= len(chunk)
        writer.write(chunk)
        await writer.drain()
    up_w.close()
    await writer.drain()
    return b"connection: close" not in head.lower()


def serve_latency(upstream: int, latency: float) -> None:
    """A light HTTP/1.1 latency proxy (asyncio, one thread; nginx replies carry Content-Length): prints its URL, then
    serves until killed. Lighter than :class:`FaultProxy` (no parsing of bodies, no thread per connection)."""
    import asyncio

    async def handle(reader, writer) -> None:  # noqa: ANN001
        try:
            while await _relay_one(reader, writer, upstream, latency):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=256)
        print(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", flush=True)
        await server.serve_forever()
    asyncio.run(main())


if __name__ == "__main__" and sys.argv[1:2] == ["proxy"]:
    serve_latency(int(sys.argv[2]), float(sys.argv[3]))
