"""The exporter kept from other local users (issue 27, attack 5): on a unix socket under the root
(members scrape, outsiders cannot connect — real other uids), and over TLS with client certificates
(a scrape without a certificate the CA signed fails)."""
from __future__ import annotations

import os
import shutil
import ssl
import stat
import subprocess
import urllib.request

import pytest

import hostmq
from tests.e2e.conftest import TEST_CONFIG, merge
from hostmq.faults.as_user import run_as
from tests.e2e.test_access import shared_root  # noqa: F401  (fixture)
from tests.e2e.test_metrics import HOSTMQ, _stop

pytestmark = pytest.mark.timeout(240)
pytest.importorskip("prometheus_client")

GROUP, MEMBER, OUTSIDER = 54340, 54341, 54342

SCRAPE_CODE = """
import http.client, socket, sys
class Conn(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(sys.argv[1])
try:
    c = Conn("localhost", timeout=30)
    c.request("GET", "/metrics")
    body = c.getresponse().read().decode()
    print("SCRAPED", "hostmq_broker_up" in body, flush=True)
except PermissionError as e:
    print("DENIED", e, flush=True)
"""


def _start(args: list[str]) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([*HOSTMQ, "exporter", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("hostmq exporter: serving "):
        _stop(p)
        raise AssertionError(line + p.stderr.read())
    return p, line.split()[3]


needs_other_uids = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("unshare"),
                                      reason="needs root, setpriv and unshare to run clients as other users")


@needs_other_uids
def test_on_a_unix_socket_members_scrape_and_outsiders_cannot_connect(shared_root):  # noqa: F811
    root, scratch = shared_root
    cluster = hostmq.LocalCluster(root, config=merge(TEST_CONFIG, {"access": {"group": str(GROUP)}})).start()
    exporter = None
    try:
        exporter, url = _start([root, "--listen", "unix"])
        path = os.path.join(root, "exporter.sock")
        assert url == f"unix:{path}:/metrics"
        st = os.stat(path)
        assert stat.S_ISSOCK(st.st_mode) and (st.st_gid, stat.S_IMODE(st.st_mode)) == (GROUP, 0o660)
        member = run_as(MEMBER, MEMBER, [GROUP], SCRAPE_CODE, path, scratch=scratch)
        assert "SCRAPED True" in member.stdout, member.stdout + member.stderr
        outsider = run_as(OUTSIDER, OUTSIDER, [], SCRAPE_CODE, path, scratch=scratch)
        assert "DENIED" in outsider.stdout and "SCRAPED" not in outsider.stdout, outsider.stdout + outsider.stderr
    finally:
        if exporter is not None:
            _stop(exporter)
        cluster.stop()
    assert not os.path.exists(os.path.join(root, "exporter.sock"))        # the exporter removed its socket


def _openssl(*args: str, cwd: str) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _certificates(d: str) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, both signed by the CA."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1",
             "-subj", "/CN=hostmq-test-ca", cwd=d)
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={name}", cwd=d)
        with open(os.path.join(d, f"{name}.ext"), "w") as f:
            f.write(ext + "\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext", cwd=d)


@pytest.mark.skipif(not shutil.which("openssl"), reason="needs the openssl command to make certificates")
def test_over_tls_a_scrape_needs_a_client_certificate_the_ca_signed(cluster, tmp_path):
    c = cluster()
    d = str(tmp_path / "pki")
    os.makedirs(d)
    _certificates(d)
    exporter, url = _start([c.root, "--listen", "127.0.0.1:0", "--tls-cert", f"{d}/server.pem",
                            "--tls-key", f"{d}/server.key", "--tls-client-ca", f"{d}/ca.pem"])
    try:
        assert url.startswith("https://127.0.0.1:")
        with_cert = ssl.create_default_context(cafile=f"{d}/ca.pem")
        with_cert.load_cert_chain(f"{d}/client.pem", f"{d}/client.key")
        with urllib.request.urlopen(url, timeout=30, context=with_cert) as r:
            assert "hostmq_broker_up" in r.read().decode()
        without = ssl.create_default_context(cafile=f"{d}/ca.pem")
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            with urllib.request.urlopen(url, timeout=30, context=without) as r:
                r.read()
    finally:
        _stop(exporter)


def test_tls_options_that_do_not_go_together_are_one_line_errors(root):
    for args in (["--tls-cert", "x.pem"], ["--listen", "unix", "--tls-cert", "a", "--tls-key", "b"],
                 ["--tls-client-ca", "ca.pem"]):
        r = subprocess.run([*HOSTMQ, "exporter", root, *args], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "--tls" in r.stderr or "TLS" in r.stderr, r.stderr
