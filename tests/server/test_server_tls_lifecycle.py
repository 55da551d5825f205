"""TLS with a generated certificate, and graceful shutdown: SIGTERM lets an in-flight stream
finish, then the server exits cleanly."""

from __future__ import annotations

import datetime
import ipaddress
import json
import signal
import ssl
import time
from pathlib import Path

import httpx
import openai
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from infernetes.runtime.server.sse_reader import sse_lines


def write_self_signed(directory) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = directory / "key.pem", directory / "cert.pem"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(key_path), str(cert_path)


@pytest.fixture(scope="module")
def tls_server(server_process_factory, tiny_llama_dir, tmp_path_factory):
    directory = tmp_path_factory.mktemp("tls")
    key, cert = write_self_signed(directory)
    server = server_process_factory(
        [
            str(tiny_llama_dir),
            "--ssl-keyfile",
            key,
            "--ssl-certfile",
            cert,
            "--max-model-len",
            "256",
            "--enable-ssl-refresh",
        ],
        scheme="https",
        log_name="tls-server.log",
    )
    server.ssl = ssl.create_default_context(cafile=cert)
    server.directory = directory
    server.wait_ready(verify=ssl.create_default_context(cafile=cert))
    yield server
    server.stop()


def test_tls_with_generated_certificate(tls_server):
    with httpx.Client(verify=tls_server.ssl) as http:
        client = openai.OpenAI(
            base_url=f"{tls_server.url}/v1", api_key="unused", http_client=http, max_retries=0
        )
        response = client.completions.create(
            model=client.models.list().data[0].id, prompt="Hello", max_tokens=3
        )
        assert response.usage.completion_tokens == 3
    with pytest.raises(httpx.ConnectError):  # an unverified certificate is refused
        httpx.get(f"{tls_server.url}/health")
    with pytest.raises(httpx.HTTPError):  # and plain HTTP is not served on the TLS port
        httpx.get(tls_server.url.replace("https", "http") + "/health", timeout=5)


def test_certificate_refresh(tls_server):
    """--enable-ssl-refresh: new certificate files are served without a restart."""
    port = int(tls_server.url.rsplit(":", 1)[1])
    before = ssl.get_server_certificate(("127.0.0.1", port))
    _, cert = write_self_signed(tls_server.directory)  # same paths, new key and certificate
    new = Path(cert).read_text()
    assert new != before
    for _ in range(50):
        if ssl.get_server_certificate(("127.0.0.1", port)) == new:
            break
        time.sleep(0.2)
    assert ssl.get_server_certificate(("127.0.0.1", port)) == new
    tls_server.ssl = ssl.create_default_context(cafile=cert)


def test_sigterm_drains_in_flight_streams(tls_server):
    model = httpx.get(f"{tls_server.url}/v1/models", verify=tls_server.ssl).json()["data"][0]["id"]
    body = {
        "model": model,
        "prompt": "Drain",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage = None
    with (
        httpx.Client(verify=tls_server.ssl, timeout=120) as http,
        http.stream("POST", f"{tls_server.url}/v1/completions", json=body) as response,
    ):
        lines = sse_lines(response.iter_text())
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["choices"]
        tls_server.process.send_signal(signal.SIGTERM)
        for line in lines:
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
    assert usage is not None and usage["completion_tokens"] == 200
    assert tls_server.process.wait(60) == 0
    assert "Finished server process" in tls_server.tail()


def test_a_busy_port_is_exit_1_before_anything_loads(tiny_llama_dir):
    """The port is bound first: no model load, no engine-core child, a message naming it."""
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "infernetes.cli.main",
                "serve",
                str(tiny_llama_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert result.returncode == 1, result.stderr[-2000:]
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "loading" not in result.stderr.lower() and "Loading weights" not in result.stderr
