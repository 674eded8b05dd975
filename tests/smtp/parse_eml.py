#!/usr/bin/env python3
"""Prints a received message as JSON, parsed by Python's own e-mail package
(an independent MIME reader for the tests):

    parse_eml.py FILE.eml

{"headers": {name: raw value}, "subject": decoded, "from": decoded,
 "to": decoded, "content_type": ..., "defects": [...],
 "parts": [{"content_type", "charset", "transfer_encoding", "body"}]}
"""

import email
import email.policy
import json
import sys


def main():
    with open(sys.argv[1], "rb") as f:
        raw = f.read()
    msg = email.message_from_bytes(raw, policy=email.policy.default)
    raw_headers = email.message_from_bytes(raw, policy=email.policy.compat32)
    parts = []
    for part in msg.walk():
        if part.is_multipart():
            continue
        parts.append({
            "content_type": part.get_content_type(),
            "charset": part.get_content_charset(),
            "transfer_encoding": part.get("Content-Transfer-Encoding"),
            # The wire has CRLF; Python keeps it in decoded text parts.
            "body": part.get_content().replace("\r\n", "\n"),
        })
    print(json.dumps({
        "headers": {k: v for k, v in raw_headers.items()},
        "subject": str(msg["Subject"]),
        "from": str(msg["From"]),
        "to": str(msg["To"]),
        "content_type": msg.get_content_type(),
        "defects": [repr(d) for d in msg.defects]
        + [repr(d) for p in msg.walk() for d in p.defects],
        "parts": parts,
    }))


if __name__ == "__main__":
    main()
