#!/usr/bin/env python3
"""The flows generated tests cannot finish, against the document.

    python3 scripts/contract_flows.py http://127.0.0.1:PORT/api

Schemathesis cannot type a TOTP code, so its stateful phase stops at the
second factor. This script walks the rest for real (TOTP enrolment, 2FA
login with a code, trusted devices, backup codes, refresh by cookie and
by body, API keys and their scopes, introspection, webhooks and their
signatures, the audit log's pages, removal of the last method) and puts
every response through Schemathesis's own conformance checks against the
served document: status documented, content type, headers and body as
documented, no 5xx. It also asserts the status each step must have.
Exits non-zero on the first failure.
"""

import base64
import hashlib
import hmac
import struct
import sys
import time
import uuid

import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
ORIGIN = "https://app.example.com"
PASSWORD = "Flow-Pass-1!"

base = sys.argv[1].rstrip("/")
schema = schemathesis.openapi.from_url(f"{base}/openapi.json")
steps = 0


def call(method, template, expect, body=None, token=None, key=None, headers=None,
         params=None, query=None, cookies=None):
    """One request, checked against the document and against `expect`."""
    global steps
    steps += 1
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"Bearer {token}"
    if key:
        h["X-API-Key"] = key
    kwargs = {"headers": h}
    if body is not None:
        kwargs["body"] = body
        kwargs["media_type"] = "application/json"
    if params:
        kwargs["path_parameters"] = params
    if query:
        kwargs["query"] = query
    if cookies:
        kwargs["cookies"] = cookies
    case = schema[template][method].Case(**kwargs)
    resp = case.call(base_url=base)
    try:
        case.validate_response(resp, checks=CHECKS)
    except Exception:
        print(f"step {steps}: {method} {template} -> {resp.status_code} {resp.text[:300]}", file=sys.stderr)
        raise
    if resp.status_code != expect:
        raise SystemExit(f"step {steps}: {method} {template}: expected {expect}, got "
                         f"{resp.status_code} {resp.text[:300]}")
    return resp


def data(resp):
    return resp.json()["data"]


def error(resp):
    return resp.json()["error"]


def totp(secret_b32, at):
    raw = base64.b32decode(secret_b32 + "=" * (-len(secret_b32) % 8))
    digest = hmac.new(raw, struct.pack(">Q", int(at) // 30), hashlib.sha1).digest()
    offset = digest[-1] & 0x0F
    value = struct.unpack(">I", digest[offset:offset + 4])[0] & 0x7FFFFFFF
    return f"{value % 1_000_000:06d}"


def main():
    for path in ["/health", "/health/live", "/health/ready", "/openapi.json"]:
        call("GET", path, 200)
    call("GET", "/webhooks/events", 200)

    name = "flow" + uuid.uuid4().hex[:8]
    email = f"{name}@example.com"
    reg = data(call("POST", "/auth/register", 201,
                    {"email": email, "username": name, "password": PASSWORD}))
    assert error(call("POST", "/auth/register", 409,
                      {"email": email.upper(), "username": name + "x", "password": PASSWORD})) \
        == "Email already registered"
    token = data(call("POST", "/auth/login", 200, {"email": name, "password": PASSWORD}))["accessToken"]
    call("POST", "/auth/login", 401, {"emailOrUsername": email, "password": PASSWORD + "x"})
    call("GET", "/auth/me", 200, token=reg["accessToken"])

    # TOTP enrolment.
    setup = data(call("POST", "/2fa/totp/setup", 200, token=token))
    secret, backup = setup["secret"], setup["backupCodes"]
    call("POST", "/2fa/totp/verify", 400, {"code": "000000", "secret": "A" * 32}, token=token)
    now = time.time()
    call("POST", "/2fa/totp/verify-setup", 200, {"code": totp(secret, now), "secret": secret}, token=token)
    methods = data(call("GET", "/2fa/methods", 200, token=token))["methods"]
    assert [m["type"] for m in methods] == ["totp"]
    assert data(call("GET", "/auth/me", 200, token=token))["twoFactorEnabled"] is True

    # Login with the second factor; a trusted device.
    challenge = data(call("POST", "/auth/login", 200, {"emailOrUsername": email, "password": PASSWORD}))
    assert challenge["requiresTwoFactor"] and set(challenge["availableMethods"]) == {"totp", "backup"}
    temp = challenge["tempToken"]
    assert error(call("POST", "/2fa/send-code", 400, {"tempToken": temp, "method": "sms"})) \
        == "No 2FA method available"
    call("POST", "/2fa/verify", 400, {"tempToken": "nope", "code": "123456"})
    call("POST", "/2fa/verify", 400, {"tempToken": temp, "code": "000000", "method": "totp"})
    verified = data(call("POST", "/2fa/verify", 200,
                         {"tempToken": temp, "code": totp(secret, now + 30), "trustDevice": True,
                          "deviceName": "contract box"}))
    token, device_token = verified["accessToken"], verified["deviceToken"]
    call("POST", "/2fa/verify", 400, {"tempToken": temp, "code": totp(secret, now + 30)})
    skipped = data(call("POST", "/auth/login", 200,
                        {"emailOrUsername": email, "password": PASSWORD, "deviceToken": device_token}))
    assert "accessToken" in skipped
    call("POST", "/auth/login", 200, {"email": email, "password": PASSWORD},
         headers={"X-Device-Token": device_token})
    devices = data(call("GET", "/2fa/devices", 200, token=token))["devices"]
    assert len(devices) == 1 and devices[0]["deviceName"] == "contract box"
    call("DELETE", "/2fa/devices/{deviceId}", 200, token=token, params={"deviceId": devices[0]["id"]})
    call("DELETE", "/2fa/devices/{deviceId}", 404, token=token, params={"deviceId": devices[0]["id"]})
    assert data(call("DELETE", "/2fa/devices", 200, token=token))["removedCount"] == 0

    # Backup codes.
    temp = data(call("POST", "/auth/login", 200, {"emailOrUsername": email, "password": PASSWORD}))["tempToken"]
    used = data(call("POST", "/2fa/verify-backup-code", 200, {"tempToken": temp, "backupCode": backup[0]}))
    assert used["remainingCodes"] == 9
    temp = data(call("POST", "/auth/login", 200, {"emailOrUsername": email, "password": PASSWORD}))["tempToken"]
    assert error(call("POST", "/2fa/verify-backup", 400, {"tempToken": temp, "code": backup[0].lower()})) \
        == "This backup code has already been used"
    call("POST", "/2fa/verify-backup", 200, {"tempToken": temp, "code": backup[1]})
    assert data(call("GET", "/2fa/backup-codes/count", 200, token=token)) == {"remaining": 8, "total": 10}
    assert len(data(call("POST", "/2fa/backup-codes/generate", 200, token=token))["backupCodes"]) == 10

    # Sessions and refresh.
    refresh = skipped["refreshToken"]
    call("POST", "/auth/refresh", 403, cookies={"refreshToken": refresh})
    rotated = data(call("POST", "/auth/refresh", 200, cookies={"refreshToken": refresh},
                        headers={"Origin": ORIGIN}))
    call("POST", "/auth/refresh", 200, {"refreshToken": rotated["refreshToken"]})
    call("POST", "/auth/refresh", 401, {"refreshToken": refresh})
    sessions = data(call("GET", "/auth/sessions", 200, token=token))["sessions"]
    other = [s for s in sessions if not s["current"]]
    assert other, sessions
    call("DELETE", "/auth/sessions/{sessionId}", 200, token=token, params={"sessionId": other[0]["id"]})
    call("DELETE", "/auth/sessions/{sessionId}", 404, token=token, params={"sessionId": other[0]["id"]})

    # API keys, scopes, introspection.
    created = data(call("POST", "/api-keys", 201, {"name": "reader", "scopes": ["2fa:read", "user:read"],
                                                   "expiresInDays": 30}, token=token))
    key = created["apiKey"]
    call("GET", "/2fa/methods", 200, key=key)
    call("GET", "/auth/me", 200, token=key)
    assert error(call("POST", "/2fa/totp/setup", 403, key=key)) \
        == "Insufficient permissions. Required scope: 2fa:write"
    call("GET", "/api-keys", 401, key=key)
    call("POST", "/auth/introspect", 403, {"token": token}, key=key)
    assert len(data(call("GET", "/api-keys", 200, token=token))["apiKeys"]) == 1
    rotated_key = data(call("POST", "/api-keys/{apiKeyId}/rotate", 200, token=token,
                            params={"apiKeyId": created["id"]}))["apiKey"]
    call("GET", "/2fa/methods", 401, key=key)
    call("GET", "/2fa/methods", 200, key=rotated_key)
    call("DELETE", "/api-keys/{apiKeyId}", 200, token=token, params={"apiKeyId": created["id"]})
    call("DELETE", "/api-keys/{apiKeyId}", 404, token=token, params={"apiKeyId": created["id"]})
    gateway = data(call("POST", "/api-keys", 201, {"name": "gateway", "scopes": ["auth:introspect"]},
                        token=token))["apiKey"]
    assert data(call("POST", "/auth/introspect", 200, {"token": token}, key=gateway))["active"] is True
    assert data(call("POST", "/auth/introspect", 200, {"token": "x.y.z"}, key=gateway)) == {"active": False}

    # Webhooks.
    hook = data(call("POST", "/webhooks", 201, {"url": "https://hooks.example.com/in",
                                                "events": ["2fa.verified", "webhook.test"]}, token=token))
    payload = '{"event":"webhook.test"}'
    sig = hmac.new(hook["secret"].encode(), payload.encode(), hashlib.sha256).hexdigest()
    call("POST", "/webhooks/verify-signature", 200,
         {"webhookId": hook["id"], "payload": payload, "signature": f"sha256={sig}"}, token=token)
    assert error(call("POST", "/webhooks/verify-signature", 400,
                      {"webhookId": hook["id"], "payload": payload + " ", "signature": sig}, token=token)) \
        == "Invalid webhook signature"
    call("POST", "/webhooks/{webhookId}/test", 200, token=token, params={"webhookId": hook["id"]})
    call("GET", "/webhooks/{webhookId}/deliveries", 200, token=token, params={"webhookId": hook["id"]})
    call("GET", "/webhooks/{webhookId}", 200, token=token, params={"webhookId": hook["id"]})
    call("GET", "/webhooks", 200, token=token)
    call("DELETE", "/webhooks/{webhookId}", 200, token=token, params={"webhookId": hook["id"]})
    call("GET", "/webhooks/{webhookId}", 404, token=token, params={"webhookId": hook["id"]})

    # The audit log, page by page.
    page = data(call("GET", "/audit-log", 200, token=token, query={"limit": 5}))
    assert len(page["events"]) == 5 and page["nextCursor"]
    call("GET", "/audit-log", 200, token=token, query={"limit": 5, "cursor": page["nextCursor"]})
    call("GET", "/audit-log", 400, token=token, query={"limit": 0})

    # The last method, then no method.
    totp_id = data(call("GET", "/2fa/methods", 200, token=token))["methods"][0]["id"]
    assert error(call("DELETE", "/2fa/methods/{methodId}", 400, token=token, params={"methodId": totp_id})) \
        == "Cannot remove the last 2FA method while 2FA is enabled"
    assert data(call("DELETE", "/2fa/totp", 200, token=token))["twoFactorEnabled"] is False
    call("DELETE", "/2fa/totp", 404, token=token)
    call("POST", "/2fa/backup-codes/generate", 400, token=token)
    call("POST", "/2fa/totp/verify-setup", 400, {"code": "123456"}, token=token)

    # The end of sessions.
    assert data(call("POST", "/auth/introspect", 200, {"token": token}, key=gateway))["active"] is True
    call("POST", "/auth/logout", 200, token=token)
    assert data(call("POST", "/auth/introspect", 200, {"token": token}, key=gateway)) == {"active": False}
    call("GET", "/auth/me", 401, token=token)
    last = data(call("POST", "/auth/login", 200, {"email": name, "password": PASSWORD}))["accessToken"]
    assert data(call("POST", "/auth/revoke-sessions", 200, token=last))["revokedCount"] >= 1
    call("GET", "/auth/me", 401, token=last)
    print(f"contract flows: {steps} requests, every response as documented")


if __name__ == "__main__":
    main()
