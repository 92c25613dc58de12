"""A throwaway certificate authority for TLS tests, made with the ``openssl`` CLI."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

needs_openssl = pytest.mark.skipif(
    shutil.which("openssl") is None, reason="the openssl CLI makes the throwaway test CA"
)


def make_certs(d: Path, name: str = "ca", ips: tuple[str, ...] = ()) -> dict[str, Path]:
    """A throwaway CA and a server certificate it signs for 127.0.0.1 / localhost (and
    for each address of ``ips``)."""
    d.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, cert = (
        d / f"{name}{x}" for x in (".key", ".pem", "-srv.key", ".csr", "-srv.pem")
    )
    ext = d / f"{name}.ext"
    ext.write_text(
        f"subjectAltName={','.join(f'IP:{ip}' for ip in ('127.0.0.1', *ips))},DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth\n"
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)

    run("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
        "-subj", f"/CN=harness test {name}", "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign")  # fmt: skip
    run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=localhost")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return {"ca": ca, "key": key, "cert": cert}
