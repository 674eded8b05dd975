#!/usr/bin/env python3
"""A real SMTP server (aiosmtpd) for the e-mail tests, on 127.0.0.1 only.

    server.py --dir DIR [--tls none|starttls|implicit] [--auth USER:PASSWORD]
              [--auth-exclude MECH] [--port N] [--lifetime SECONDS]

- Listens on 127.0.0.1 (port N, or a free one when N is 0, the default).
- With --tls starttls or implicit, first creates a test CA and a server
  certificate for `localhost` and `127.0.0.1` with the `openssl` command:
  DIR/ca.pem is the CA to trust (what EMAIL_TLS_CA_PEM holds in the tests).
- With --auth, offers AUTH PLAIN and LOGIN (minus --auth-exclude) and accepts
  only that user and password. With --tls starttls, AUTH is offered only
  after STARTTLS.
- Every accepted message is written to DIR/N.eml (the bytes received after
  DATA, un-dot-stuffed) with DIR/N.json beside it: envelope sender,
  recipients, whether the session was under TLS, the authenticated user.
- Prints `READY <port>` on stdout once it accepts connections, then runs until
  stdin is closed (the test holds the pipe) or --lifetime seconds pass.
"""

import argparse
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import warnings

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

HOST = "127.0.0.1"

# aiosmtpd itself touches its deprecated Session.login_data on every AUTH.
warnings.filterwarnings("ignore", message="Session.login_data")


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)


def make_certificates(directory):
    """A CA and a server certificate it signs (EC P-256, valid 2 days)."""
    ca_key, ca = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.pem")
    key, csr = os.path.join(directory, "server.key"), os.path.join(directory, "server.csr")
    cert, ext = os.path.join(directory, "server.pem"), os.path.join(directory, "server.ext")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca,
         "-days", "2", "-subj", "/CN=tfa SMTP test CA"])
    run(["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=localhost"])
    with open(ext, "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature\n"
                "extendedKeyUsage=serverAuth\n"
                "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
         "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


class Saver:
    """Writes each message and what the session looked like."""

    def __init__(self, directory):
        self.directory = directory
        self.count = 0
        self.lock = threading.Lock()

    async def handle_DATA(self, server, session, envelope):
        with self.lock:
            self.count += 1
            n = self.count
        base = os.path.join(self.directory, str(n))
        with open(base + ".eml.tmp", "wb") as f:
            f.write(envelope.original_content or envelope.content)
        auth = session.auth_data
        login = auth.login.decode() if isinstance(auth, LoginPassword) else None
        meta = {
            "mail_from": envelope.mail_from,
            "rcpt_tos": envelope.rcpt_tos,
            "tls": server.transport.get_extra_info("ssl_object") is not None,
            "auth_user": login if session.authenticated else None,
        }
        with open(base + ".json", "w") as f:
            json.dump(meta, f)
        # The .eml appears last and whole: the test waits for it.
        os.rename(base + ".eml.tmp", base + ".eml")
        return "250 2.0.0 Message accepted"


def authenticator_for(user, password):
    def check(server, session, envelope, mechanism, auth_data):
        ok = (isinstance(auth_data, LoginPassword)
              and auth_data.login == user.encode()
              and auth_data.password == password.encode())
        return AuthResult(success=ok, handled=False, auth_data=auth_data if ok else None)
    return check


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--tls", choices=["none", "starttls", "implicit"], default="none")
    p.add_argument("--auth")
    p.add_argument("--auth-exclude", action="append", default=[])
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--lifetime", type=float, default=120.0)
    args = p.parse_args()
    os.makedirs(args.dir, exist_ok=True)

    kwargs = {"server_hostname": "localhost", "ready_timeout": 10.0}
    context = make_certificates(args.dir) if args.tls != "none" else None
    if args.tls == "starttls":
        kwargs["tls_context"] = context
    elif args.tls == "implicit":
        kwargs["ssl_context"] = context
    if args.auth:
        user, _, password = args.auth.partition(":")
        kwargs["authenticator"] = authenticator_for(user, password)
        # aiosmtpd counts only STARTTLS as TLS for this check; under implicit
        # TLS every byte is encrypted anyway.
        kwargs["auth_require_tls"] = args.tls == "starttls"
        kwargs["auth_exclude_mechanism"] = args.auth_exclude

    controller = None
    for _ in range(5):
        port = args.port or free_port()
        try:
            controller = Controller(Saver(args.dir), hostname=HOST, port=port, **kwargs)
            controller.start()
            break
        except Exception as e:  # port taken between free_port() and start(): retry
            controller = None
            if args.port:
                raise
            print(f"retrying after {e!r}", file=sys.stderr)
    if controller is None:
        sys.exit("could not start the SMTP server")
    print(f"READY {port}", flush=True)

    done = threading.Event()

    def wait_stdin():
        try:
            sys.stdin.read()
        finally:
            done.set()

    threading.Thread(target=wait_stdin, daemon=True).start()
    deadline = time.monotonic() + args.lifetime
    while not done.is_set() and time.monotonic() < deadline:
        done.wait(0.2)
    controller.stop()


if __name__ == "__main__":
    main()
