"""http(s) datasets behind the proxies companies run: credentials in the proxy's URL (sent on plain http requests and
on the CONNECT of an https tunnel), ``no_proxy`` with ports, domains and networks."""

from __future__ import annotations

import base64
import shutil
import urllib.request
from urllib.parse import urlsplit

import pytest
from s3server import http_server, https_server
from video_fixtures import coded_dataset

from moquad import objstore
from moquad.data import store
from moquad.errors import MoquadError

USER, PASSWORD = "moquad user", "p@ss:w/rd%"  # percent-encoded in the proxy URL
QUOTED = "moquad%20user:p%40ss%3Aw%2Frd%25"
BASIC = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    return coded_dataset(tmp_path_factory.mktemp("proxied") / "d", num_videos=4, num_frames=6)


@pytest.fixture()
def env(monkeypatch):
    """No proxy settings but the test's own; clients and connections made anew before and after."""
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.upper(), raising=False)
    objstore.reset()
    yield monkeypatch
    objstore.reset()


def _same_dataset(url: str, local) -> None:
    remote, ref = store.Split(url), store.Split(local)
    assert [remote.payload(i) for i in range(len(ref))] == [ref.payload(i) for i in range(len(ref))]
    assert remote.frame_bytes(1, 2) == ref.frame_bytes(1, 2)


def test_plain_http_through_a_proxy_that_wants_credentials(local, env):
    """``http_proxy=http://USER:PASSWORD@HOST:PORT``: every request carries ``Proxy-Authorization: Basic``
    (urllib sent it; the kept-alive connections did not: every read got 407)."""
    with http_server(local.parent) as proxy:
        proxy.proxy_auth = BASIC
        host = proxy.url.split("://")[1]
        env.setenv("http_proxy", f"http://{QUOTED}@{host}")
        objstore.reset()
        _same_dataset(f"http://dataset.invalid/{local.name}", local)  # a host only the proxy "resolves"
        assert proxy.absolute > 2 and proxy.refused == 0
        env.setenv("http_proxy", f"http://{host}")  # no credentials: one error line saying what to do
        objstore.reset()
        with pytest.raises(MoquadError, match=r"the proxy \(127.0.0.1:\d+\) asks for credentials \(HTTP 407\)"):
            objstore.read_all(f"http://dataset.invalid/{local.name}/dataset.json")
        env.setenv("http_proxy", f"http://{USER}:wrong@{host}")
        objstore.reset()
        with pytest.raises(MoquadError, match="HTTP 407") as e:
            objstore.read_all(f"http://dataset.invalid/{local.name}/dataset.json")
        assert "wrong" not in str(e.value) and USER not in str(e.value)  # credentials never in a message


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the https server's certificate is made by openssl")
def test_https_tunnel_sends_the_proxy_credentials_on_connect(local, env, tmp_path):
    """``https_proxy`` with credentials: the CONNECT carries them, then TLS (verified against the server's
    certificate) runs inside the tunnel to a real https server; without them, one error line."""
    with https_server(local.parent) as tls, http_server(tmp_path) as proxy:
        proxy.proxy_auth, proxy.tunnel_to = BASIC, tls.server_address[1]
        host = proxy.url.split("://")[1]
        env.setenv("SSL_CERT_FILE", tls.cert)
        env.setenv("https_proxy", f"http://{QUOTED}@{host}")
        objstore.reset()
        _same_dataset(f"https://dataset.invalid/{local.name}", local)
        assert proxy.tunnels == [("dataset.invalid:443", BASIC)]  # ONE tunnel (kept alive) for every read
        assert proxy.absolute == 0 and proxy.refused == 0  # nothing in the clear
        env.setenv("https_proxy", f"http://{host}")
        objstore.reset()
        with pytest.raises(MoquadError, match=r"the proxy \(127.0.0.1:\d+\) asks for credentials \(HTTP 407\)"):
            objstore.read_all(f"https://dataset.invalid:8443/{local.name}/dataset.json")
        assert proxy.tunnels[-1] == ("dataset.invalid:8443", None) and proxy.refused == 1  # not retried


NO_PROXY = [  # (url, no_proxy, sent direct)
    ("http://127.0.0.1:8080/x", "127.0.0.1:8080", True),  # host:port: that port only
    ("http://127.0.0.1:9090/x", "127.0.0.1:8080", False),
    ("http://127.0.0.1:9090/x", "127.0.0.1", True),  # a host: any port
    ("http://h.example.com:8080/x", "example.com", True),  # a domain: its subdomains too
    ("http://h.example.com:8080/x", ".example.com", True),
    ("http://h.example.com:8080/x", "other.org, example.com:8080", True),
    ("http://h.example.com:8080/x", "example.com:80", False),
    ("http://badexample.com:8080/x", "example.com", False),
    ("http://H.Example.COM:8080/x", "h.example.com", True),
    ("http://data.lab:8080/x", "*", True),
    ("https://h.example.com/x", "h.example.com:443", True),  # the scheme's default port
    ("http://h.example.com/x", "h.example.com:443", False),
    ("http://10.1.2.3:8080/x", "10.0.0.0/8", True),  # requests' networks
    ("http://11.1.2.3:8080/x", "10.0.0.0/8", False),
    ("http://[::1]:8080/x", "[::1]:8080", True),
    ("http://[::1]:8080/x", "::1", True),
    ("http://[::1]:8080/x", "[::1]:9090", False),
    ("http://h.example.com:8080/x", "", False),
]


@pytest.mark.parametrize("url,no_proxy,direct", NO_PROXY)
def test_no_proxy_is_matched_with_ports_domains_and_networks(url, no_proxy, direct):
    u = urlsplit(url)
    assert objstore._bypassed(u, no_proxy) is direct
    if u.port and "/" not in no_proxy and "[" not in url + no_proxy and no_proxy.count(":") <= 1:
        # urllib's own matcher (it compares the host and the host:port as written) agrees
        assert bool(urllib.request.proxy_bypass_environment(u.netloc.lower(), {"no": no_proxy})) is direct


def test_no_proxy_with_a_port_sends_that_server_direct(local, env):
    """``no_proxy=127.0.0.1:PORT`` (it was matched against the host without its port: never)."""
    with http_server(local.parent) as srv:
        env.setenv("http_proxy", srv.url)  # the server plays the proxy too: it counts requests naming a whole URL
        env.setenv("no_proxy", f"localhost,127.0.0.1:{srv.server_address[1]}")
        objstore.reset()
        assert objstore.read_all(f"{srv.url}/{local.name}/dataset.json") == (local / "dataset.json").read_bytes()
        assert srv.absolute == 0
        env.setenv("no_proxy", "127.0.0.1:1")  # another port: through the proxy
        objstore.reset()
        assert objstore.read_all(f"{srv.url}/{local.name}/dataset.json") == (local / "dataset.json").read_bytes()
        assert srv.absolute == 1
