#!/usr/bin/env python3
"""HTTPS webhook receiver for the end-to-end tests (issue #14).

  receiver.py --dir DIR --name hook.test,flip.test --bind 127.0.0.2 [--lifetime 120]

Makes a test CA (DIR/ca.pem) and a certificate for the --name list signed by it,
serves HTTPS on --bind (a free port, printed as "PORT n" on stdout), answers
every POST with 200, except paths starting with /redirect, answered
302 Location: https://FIRST-NAME:PORT/followed. Every request is appended to
DIR/requests.log as "METHOD PATH". Exits after --lifetime seconds.
"""
import argparse
import http.server
import os
import ssl
import subprocess
import sys
import threading


def run(cmd):
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)


def make_certificates(directory, name):
    ca_key, ca = os.path.join(directory, "ca.key"), os.path.join(directory, "ca.pem")
    key, csr = os.path.join(directory, "server.key"), os.path.join(directory, "server.csr")
    cert, ext = os.path.join(directory, "server.pem"), os.path.join(directory, "server.ext")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run(["openssl", "req", "-x509", *ec, "-keyout", ca_key, "-out", ca,
         "-days", "2", "-subj", "/CN=tfa webhook test CA"])
    run(["openssl", "req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=" + name.split(",")[0]])
    with open(ext, "w") as f:
        f.write("basicConstraints=critical,CA:FALSE\n"
                "keyUsage=critical,digitalSignature\n"
                "extendedKeyUsage=serverAuth\n"
                "subjectAltName=" + ",".join("DNS:" + n for n in name.split(",")) + "\n")
    run(["openssl", "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key,
         "-CAcreateserial", "-out", cert, "-days", "2", "-extfile", ext])
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--bind", default="127.0.0.2")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--lifetime", type=float, default=120)
    a = ap.parse_args()
    context = make_certificates(a.dir, a.name)
    log = os.path.join(a.dir, "requests.log")
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            n = int(self.headers.get("content-length") or 0)
            self.rfile.read(n)
            with lock, open(log, "a") as f:
                f.write(f"{self.command} {self.path}\n")
            if self.path.startswith("/redirect"):
                self.send_response(302)
                port = self.server.server_address[1]
                self.send_header("location", f"https://{a.name.split(',')[0]}:{port}/followed")
            else:
                self.send_response(200)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    try:
        server = http.server.ThreadingHTTPServer((a.bind, a.port), Handler)
    except OSError as e:
        print("BIND-FAILED", e, flush=True)
        sys.exit(1)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Timer(a.lifetime, server.shutdown).start()
    print("PORT", server.server_address[1], flush=True)
    server.serve_forever()
    sys.exit(0)


if __name__ == "__main__":
    main()
