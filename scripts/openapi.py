#!/usr/bin/env python3
"""Writes core/openapi.json, the OpenAPI 3.1 document of the whole API.

    scripts/openapi.py           # (re)write core/openapi.json
    scripts/openapi.py --check   # exit 1 when the committed file is stale

The document is data, but written by hand it would repeat the envelope, the
error shapes and the security alternatives on every operation; here each is
written once. Every error message is one of ApiError's (core/src/contract/error.rs);
core's tests hold the document to the router's table and to those messages.
Python 3 standard library only.
"""

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "core" / "openapi.json"


def ref(name):
    return {"$ref": f"#/components/schemas/{name}"}


def obj(props, required=None, extra=False, **kw):
    """An object schema; `required` defaults to every property."""
    out = {"type": "object", "properties": props}
    req = list(props) if required is None else required
    if req:
        out["required"] = req
    if not extra:
        out["additionalProperties"] = False
    out.update(kw)
    return out


def s(**kw):
    return {"type": "string", **kw}


def nullable(schema):
    out = dict(schema)
    out["type"] = [schema["type"], "null"]
    return out


INT = {"type": "integer", "minimum": 0}
BOOL = {"type": "boolean"}
UUID = s(format="uuid")
B64URL = s(pattern="^[A-Za-z0-9_-]+$", description="base64url without padding")
TIME = s(format="date-time")
JWT = s(pattern=r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
METHOD_TYPES = ["totp", "sms", "email", "webauthn"]
SCOPES = ["*", "user:read", "2fa:read", "2fa:write", "webhooks:read",
          "webhooks:write", "audit:read", "auth:introspect"]
EVENTS = ["user.registered", "user.login", "user.logout", "2fa.enabled",
          "2fa.disabled", "2fa.verified", "2fa.failed", "backup_code.used",
          "device.trusted", "device.removed", "session.revoked", "webhook.test",
          "passkey.registered", "passkey.removed", "passkey.counter_regression"]
ACTIONS = ["register", "login_success", "login_failed", "logout",
           "token_refreshed", "sessions_revoked", "2fa_setup_started",
           "2fa_enabled", "2fa_disabled", "2fa_verified", "2fa_failed",
           "code_sent", "backup_code_used", "backup_codes_regenerated",
           "trusted_device_added", "trusted_device_removed",
           "api_key_created", "api_key_revoked", "webhook_created",
           "webhook_deleted", "rate_limited", "webauthn_registered",
           "webauthn_removed", "webauthn_counter_regression"]
# A 6-digit code as the service reads it: surrounding white space and spaces
# between the digits are ignored.
OTP_CODE = s(pattern=r"^\s*[0-9](?: *[0-9]){5}\s*$",
             description="6 digits; spaces are ignored", examples=["123456"])
BACKUP_CODE = s(maxLength=64,
                description="10 characters A-Z0-9 as issued; matched case-insensitively, "
                            "spaces and hyphens ignored", examples=["ABCDE12345"])

# --- Error messages: exactly ApiError::status_and_message (core/src/contract/error.rs).
VALIDATION = "Validation error: "
M = {
    "InvalidCredentials": "Invalid email or password",
    "InvalidToken": "Invalid or expired token",
    "InvalidRefreshToken": "Invalid refresh token",
    "EmailTaken": "Email already registered",
    "UsernameTaken": "Username already taken",
    "InvalidCode": "Invalid verification code",
    "InvalidTempToken": "Invalid temp token",
    "BackupCodeUsed": "This backup code has already been used",
    "SetupNotInitiated": "2FA setup not initiated",
    "NoMethod": "No 2FA method available",
    "LastMethod": "Cannot remove the last 2FA method while 2FA is enabled",
    "InvalidSignature": "Invalid webhook signature",
    "CsrfOrigin": "Invalid CSRF origin",
    "NotFound": "Resource not found",
    "BodyTooLarge": "Request body too large",
    "RateLimited": "Too many requests. Please try again later.",
    "Internal": "Internal server error",
    "Unavailable": "Service unavailable",
    "SmsNotConfigured": "SMS service not configured",
    "EmailNotConfigured": "Email service not configured",
    "DeliveryFailed": "Failed to send verification code",
    "PasskeyChallenge": "Invalid or expired passkey challenge",
    "PasskeyRegistered": "Passkey already registered",
}
STATUS_TEXT = {
    400: "Validation error or malformed request",
    401: "Missing or invalid authentication",
    403: "Authenticated but lacking permission",
    404: "Resource does not exist",
    409: "Resource already exists",
    413: "Request body larger than 64 KiB",
    429: "Rate limit exceeded",
    500: "Unexpected failure (details only in the log)",
    503: "Service unavailable",
}


def error_schema(messages, validation=False):
    alts = []
    if messages:
        alts.append({"enum": messages})
    if validation:
        alts.append({"pattern": "^Validation error: .+"})
    msg = {"type": "string"}
    if len(alts) == 1:
        msg.update(alts[0])
    else:
        msg["anyOf"] = alts
    return obj({"success": {"const": False}, "error": msg})


RATE_HEADERS = {
    "X-RateLimit-Limit": {"$ref": "#/components/headers/X-RateLimit-Limit"},
    "X-RateLimit-Remaining": {"$ref": "#/components/headers/X-RateLimit-Remaining"},
    "X-RateLimit-Reset": {"$ref": "#/components/headers/X-RateLimit-Reset"},
}


def error_response(status, messages, validation=False, limited=False):
    resp = {
        "description": STATUS_TEXT[status],
        "content": {"application/json": {"schema": error_schema(messages, validation)}},
    }
    headers = {}
    if limited:
        headers.update(RATE_HEADERS)
    if status == 429:
        headers["Retry-After"] = {"$ref": "#/components/headers/Retry-After"}
    if headers:
        resp["headers"] = headers
    return resp


def envelope(data):
    return obj({"success": {"const": True}, "data": data})


# --- Security alternatives.
SESSION = [{"bearerAuth": []}]


def scoped(scope):
    return [{"bearerAuth": []}, {"apiKeyHeader": []}, {"apiKeyBearer": []}]


PUBLIC = []

# --- Schemas.
SCHEMAS = {
    "User": obj({
        "id": UUID, "email": s(format="email"),
        "username": s(pattern=r"^[A-Za-z0-9_-]{3,30}$"),
        "twoFactorEnabled": BOOL, "createdAt": TIME, "updatedAt": TIME,
    }, description="The public view of a user (never a password hash)."),
    "Me": obj({
        "id": UUID, "email": s(format="email"),
        "username": s(pattern=r"^[A-Za-z0-9_-]{3,30}$"),
        "twoFactorEnabled": BOOL, "createdAt": TIME, "updatedAt": TIME,
        "methods": {"type": "array", "items": s(enum=METHOD_TYPES),
                    "description": "the enabled second-factor methods"},
    }),
    "SessionTokens": obj({
        "user": ref("User"), "accessToken": JWT, "refreshToken": JWT,
    }, description="A new session; the refresh token is also set as the `refreshToken` cookie."),
    "TwoFactorChallenge": obj({
        "requiresTwoFactor": {"const": True}, "requires2FA": {"const": True},
        "tempToken": JWT,
        "availableMethods": {"type": "array",
                             "items": s(enum=METHOD_TYPES + ["backup"])},
    }, description="Login passed the password; a second factor is due "
                   "(`POST /2fa/verify`, `/2fa/verify-backup-code`, `/2fa/send-code`)."),
    "Session": obj({
        "id": UUID, "ipAddress": s(), "userAgent": s(), "createdAt": TIME,
        "lastUsedAt": TIME, "expiresAt": TIME,
        "current": {"type": "boolean", "description": "the session of this request"},
    }),
    "Method": obj({
        "id": UUID, "type": s(enum=METHOD_TYPES), "enabled": BOOL,
        "verifiedAt": TIME, "createdAt": TIME,
        "phoneNumber": s(description="sms only, masked: +155****4567"),
        "email": s(description="email only, masked: ali***@example.com"),
        "credentialCount": INT | {"description": "webauthn only: the user's passkeys"},
    }, required=["id", "type", "enabled", "verifiedAt", "createdAt"]),
    "Passkey": obj({
        "id": UUID, "credentialId": B64URL, "name": s(minLength=1, maxLength=64),
        "algorithm": s(enum=["ES256", "EdDSA", "RS256"]),
        "transports": {"type": "array", "items": s()},
        "backupEligible": BOOL, "backedUp": BOOL, "createdAt": TIME,
        "lastUsedAt": nullable(TIME),
    }),
    "Device": obj({
        "id": UUID, "deviceName": nullable(s(maxLength=100)), "ipAddress": s(),
        "userAgent": s(), "createdAt": TIME, "lastUsedAt": TIME,
        "expiresAt": TIME,
    }),
    "ApiKey": obj({
        "id": UUID, "name": s(maxLength=100),
        "scopes": {"type": "array", "items": s(enum=SCOPES), "minItems": 1},
        "prefix": s(pattern="^tfa_[A-Za-z0-9]{8}$"), "createdAt": TIME,
        "expiresAt": nullable(TIME), "lastUsedAt": nullable(TIME),
    }, description="An API key as listed (the key itself is shown only when created or rotated)."),
    "NewApiKey": obj({
        "id": UUID, "name": s(maxLength=100),
        "scopes": {"type": "array", "items": s(enum=SCOPES), "minItems": 1},
        "prefix": s(pattern="^tfa_[A-Za-z0-9]{8}$"), "createdAt": TIME,
        "expiresAt": nullable(TIME), "lastUsedAt": nullable(TIME),
        "apiKey": s(pattern="^tfa_[A-Za-z0-9]{40}$",
                    description="shown only here; present it as `X-API-Key` or `Authorization: Bearer`"),
    }),
    "AuditEvent": obj({
        "id": UUID, "action": s(enum=ACTIONS), "success": BOOL,
        "ipAddress": s(), "userAgent": s(),
        "details": {"type": "object", "description": "ids, method names and reasons; never secrets"},
        "createdAt": TIME,
    }),
    "Webhook": obj({
        "id": UUID, "url": s(), "events": {"type": "array", "items": s(enum=EVENTS)},
        "active": BOOL, "createdAt": TIME, "consecutiveFailures": INT,
    }),
    "NewWebhook": obj({
        "id": UUID, "url": s(), "events": {"type": "array", "items": s(enum=EVENTS)},
        "active": BOOL, "createdAt": TIME, "consecutiveFailures": INT,
        "secret": s(pattern="^[0-9a-f]{64}$",
                    description="shown only here; the HMAC-SHA-256 key, as these 64 characters"),
    }),
    "Delivery": obj({
        "id": UUID, "eventId": UUID, "event": s(enum=EVENTS),
        "status": s(enum=["pending", "succeeded", "failed"]), "createdAt": TIME,
        "nextAttemptAt": nullable(TIME),
        "attempts": {"type": "array", "items": obj({
            "at": TIME, "statusCode": nullable({"type": "integer"}),
            "error": nullable(s()),
        })},
    }),
    "Message": obj({"message": s()}),
    "Health": obj({
        "status": s(enum=["healthy", "unhealthy"]),
        "checks": obj({"database": s(enum=["up", "down"]), "redis": s(enum=["up", "down"])}),
        "timestamp": TIME, "version": s(),
    }),
}


def op(op_id, summary, tag, security, responses, errors, body=None, params=None,
       limited=True, description=None, body_required=True):
    """One operation. `errors` maps status -> list of ApiError names (a name
    of "Validation" adds the `Validation error: …` pattern)."""
    out = {"operationId": op_id, "summary": summary, "tags": [tag],
           "security": security}
    if description:
        out["description"] = description
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = {"required": body_required,
                              "content": {"application/json": {"schema": body}}}
    errs = {k: list(v) for k, v in errors.items()}
    if body is not None:
        errs.setdefault(400, [])
        if "Validation" not in errs[400]:
            errs[400].append("Validation")
        errs.setdefault(413, ["BodyTooLarge"])
    if security and security != PUBLIC:
        errs.setdefault(401, [])
        if "InvalidToken" not in errs[401]:
            errs[401].append("InvalidToken")
    if limited:
        errs.setdefault(429, ["RateLimited"])
    errs.setdefault(500, ["Internal"])
    errs.setdefault(503, [])
    if "Unavailable" not in errs[503]:
        errs[503].insert(0, "Unavailable")
    resp = {}
    for status, r in responses.items():
        r = dict(r)
        if limited:
            r["headers"] = {**RATE_HEADERS, **r.get("headers", {})}
        resp[str(status)] = r
    for status in sorted(errs):
        names = errs[status]
        msgs = [M[n] for n in names if n not in ("Validation",) and not n.startswith("scope:")]
        msgs += [f"Insufficient permissions. Required scope: {n[6:]}" for n in names if n.startswith("scope:")]
        # Shared error responses live in components, named by what they hold.
        name = f"{status}." + "+".join(n.replace("scope:", "Scope:") for n in names)
        if limited and status != 429:
            name += ".limited"
        if name not in RESPONSES:
            RESPONSES[name] = error_response(status, msgs, "Validation" in names, limited)
        resp[str(status)] = {"$ref": f"#/components/responses/{name}"}
    out["responses"] = resp
    return out


def ok(data_schema, description="Success", status_headers=None, links=None, raw=False):
    schema = data_schema if raw else envelope(data_schema)
    r = {"description": description, "content": {"application/json": {"schema": schema}}}
    if status_headers:
        r["headers"] = status_headers
    if links:
        r["links"] = links
    return r


COOKIE = {"Set-Cookie": {"$ref": "#/components/headers/Set-Cookie"}}
AUTH_FROM_BODY = "Bearer {$response.body#/data/accessToken}"
AUTH_FROM_REQUEST = "$request.header.Authorization"


def bearer_link(op_id, description, body=None, params=None, auth=AUTH_FROM_BODY):
    link = {"operationId": op_id, "description": description,
            "parameters": {"header.Authorization": auth, **(params or {})}}
    if body is not None:
        link["requestBody"] = body
    return link


def path_param(name, description):
    return {"name": name, "in": "path", "required": True, "description": description,
            "schema": s(minLength=1, maxLength=128)}


def scope(name):
    return {403: [f"scope:{name}"]}


def with_scope(errors, name):
    out = dict(errors)
    out[403] = [f"scope:{name}"]
    return out


SESSION_LINKS = {
    "Me": bearer_link("getMe", "The user just signed in."),
    "TotpSetup": bearer_link("totpSetup", "Start TOTP enrolment for this user."),
    "Sessions": bearer_link("listSessions", "This user's sessions."),
    "Refresh": {"operationId": "refresh", "description": "Rotate this session's refresh token.",
                "requestBody": {"refreshToken": "$response.body#/data/refreshToken"}},
    "Logout": bearer_link("logout", "End this session."),
    "CreateApiKey": bearer_link("createApiKey", "An API key for this user."),
    "CreateWebhook": bearer_link("createWebhook", "A webhook for this user."),
    "Methods": bearer_link("listMethods", "This user's second-factor methods."),
}

P = {}
RESPONSES = {}


def add(path, method, operation):
    P.setdefault(path, {})[method] = operation


# --- Meta
add("/openapi.json", "get", op(
    "getOpenApi", "This document", "meta", PUBLIC,
    {200: ok({"type": "object"}, "The OpenAPI 3.1 document; `servers` names the configured base path.", raw=True)},
    {}, limited=False))
add("/health", "get", op(
    "health", "Health of the service and its stores", "health", PUBLIC,
    {200: ok(ref("Health"), "Every store answers", raw=True),
     503: ok(ref("Health"), "A store does not answer (`status: unhealthy`, that check `down`)", raw=True)},
    {}, limited=False, description="Not wrapped in the envelope."))
add("/health/live", "get", op(
    "live", "Liveness: the process answers", "health", PUBLIC,
    {200: ok(obj({"status": {"const": "alive"}, "timestamp": TIME}), raw=True)},
    {}, limited=False))
add("/health/ready", "get", op(
    "ready", "Readiness: the store answers", "health", PUBLIC,
    {200: ok(obj({"status": {"const": "ready"}, "timestamp": TIME}), raw=True),
     503: ok(obj({"status": {"const": "unavailable"}, "timestamp": TIME}), "The store does not answer", raw=True)},
    {}, limited=False))

# --- Auth
REGISTER_BODY = obj({
    "email": s(format="email", description="ASCII, at most 254 characters; surrounding white space "
                                           "is ignored; compared case-insensitively"),
    "username": s(pattern=r"^[A-Za-z0-9_-]{3,30}$", description="unique case-insensitively"),
    # The pattern states the digit and the character that is not a letter
    # or digit; the upper- and lower-case letters (any script) only the
    # description: JSON Schema's regular expressions have no portable
    # Unicode classes, and the document must not refuse a password the
    # service accepts.
    "password": s(minLength=8, maxLength=128, pattern=r"^(?=[\s\S]*[0-9])(?=[\s\S]*[^A-Za-z0-9])",
                  description="at least one uppercase letter, one lowercase letter, one digit "
                              "and one special character"),
}, extra=True, examples=[{"email": "alice@example.com", "username": "alice",
                          "password": "Correct-Horse-9"}])
add("/auth/register", "post", op(
    "register", "Register a user", "auth", PUBLIC,
    {201: ok(ref("SessionTokens"), "Registered and signed in", COOKIE, links={
        **SESSION_LINKS,
        "Login": {"operationId": "login", "description": "Sign in with the new credentials.",
                  "requestBody": {"emailOrUsername": "$request.body#/email",
                                  "password": "$request.body#/password"}},
        "LoginByUsername": {"operationId": "login", "description": "Sign in by username (field `email` variant).",
                            "requestBody": {"email": "$request.body#/username",
                                            "password": "$request.body#/password"}},
    })},
    {409: ["EmailTaken", "UsernameTaken"]}, body=REGISTER_BODY))
LOGIN_BODY = {
    "type": "object",
    "properties": {
        "emailOrUsername": nullable(s(description="e-mail (when it contains `@`) or username")),
        "email": nullable(s(description="variant name of `emailOrUsername`")),
        "password": s(minLength=1),
        "deviceToken": nullable(s(description="a trusted device's token: skips the second factor")),
    },
    "required": ["password"],
    "anyOf": [{"required": ["emailOrUsername"]}, {"required": ["email"]}],
}
add("/auth/login", "post", op(
    "login", "Sign in with e-mail or username and password", "auth", PUBLIC,
    {200: ok({"oneOf": [ref("SessionTokens"), ref("TwoFactorChallenge")]},
             "Signed in (no 2FA, or a trusted device), or a second factor is due", COOKIE, links={
        **SESSION_LINKS,
        "Verify": {"operationId": "verify", "description": "Complete a 2FA login with a code.",
                   "requestBody": {"tempToken": "$response.body#/data/tempToken"}},
        "VerifyBackupCode": {"operationId": "verifyBackupCode",
                             "description": "Complete a 2FA login with a backup code.",
                             "requestBody": {"tempToken": "$response.body#/data/tempToken"}},
        "SendCode": {"operationId": "sendCode", "description": "Have an SMS or e-mail code sent.",
                     "requestBody": {"tempToken": "$response.body#/data/tempToken"}},
    })},
    {401: ["InvalidCredentials"]}, body=LOGIN_BODY,
    params=[{"name": "X-Device-Token", "in": "header", "required": False,
             "description": "alternative to body field `deviceToken`", "schema": s()}]))
add("/auth/me", "get", op(
    "getMe", "The current user", "auth", scoped("user:read"),
    {200: ok(ref("Me"))}, scope("user:read")))
add("/auth/refresh", "post", op(
    "refresh", "Rotate the refresh token; new access token", "auth",
    [{"refreshCookie": []}, {}],
    {200: ok(obj({"accessToken": JWT, "refreshToken": JWT}), "New tokens; the old refresh token is spent", COOKIE,
             links={"Me": bearer_link("getMe", "The user of the refreshed session."),
                    "RefreshAgain": {"operationId": "refresh", "description": "Rotate again.",
                                     "requestBody": {"refreshToken": "$response.body#/data/refreshToken"}}})},
    {401: ["InvalidRefreshToken"], 403: ["CsrfOrigin"]},
    body={"type": "object", "properties": {
        "refreshToken": nullable(s(description="used when no `refreshToken` cookie is sent"))}},
    body_required=False,
    description="The refresh token comes from the `refreshToken` cookie (then `Origin` must be allowed: "
                "CSRF check) or else from the body. Presenting an already rotated token ends the session."))
add("/auth/logout", "post", op(
    "logout", "End the current session", "auth", [{"bearerAuth": []}, {"refreshCookie": []}],
    {200: ok(obj({"message": {"const": "Logged out successfully"}}), "Signed out; the cookie is cleared", COOKIE)},
    {403: ["CsrfOrigin"]},
    description="By access token, or by the refresh cookie (CSRF checked) when no token is sent. "
                "An API key is refused (401)."))
add("/auth/revoke-sessions", "post", op(
    "revokeSessions", "End every session of the user", "auth", SESSION,
    {200: ok(obj({"message": {"const": "All sessions revoked"}, "revokedCount": INT}),
             "Every session ended; the cookie is cleared", COOKIE)},
    {}))
add("/auth/sessions", "get", op(
    "listSessions", "The user's live sessions, newest first", "auth", scoped("user:read"),
    {200: ok(obj({"sessions": {"type": "array", "items": ref("Session")}}), links={
        "DeleteSession": bearer_link("deleteSession", "End one of them.",
                                     params={"path.sessionId": "$response.body#/data/sessions/0/id"},
                                     auth=AUTH_FROM_REQUEST)})},
    scope("user:read")))
add("/auth/sessions/{sessionId}", "delete", op(
    "deleteSession", "End one session", "auth", SESSION,
    {200: ok(obj({"message": {"const": "Session revoked"}}))},
    {404: ["NotFound"]}, params=[path_param("sessionId", "a session id of this user")]))
add("/auth/introspect", "post", op(
    "introspect", "Is this access token active? (RFC 7662 style)", "auth", scoped("auth:introspect"),
    {200: ok({"oneOf": [
        obj({"active": {"const": False}}),
        obj({"active": {"const": True}, "sub": UUID, "sid": UUID, "mfa": BOOL,
             "amr": {"type": "array", "items": s(enum=["pwd", "otp", "sms", "mail", "hwk", "swk", "mfa"]),
                     "description": "how the user signed in (RFC 8176); empty for sessions older than this claim"},
             "exp": INT, "iat": INT, "tokenType": {"const": "access"}}),
    ]}, "`active` is false for any token that is invalid, expired, of another kind, or whose session ended")},
    scope("auth:introspect"), body=obj({"token": s(minLength=1)}, extra=True),
    description="For gateways: an API key with scope `auth:introspect` (or a session); limited per key."))

# --- TOTP
add("/2fa/totp/setup", "post", op(
    "totpSetup", "Start TOTP enrolment", "totp", scoped("2fa:write"),
    {200: ok(obj({
        "secret": s(pattern="^[A-Z2-7]{32}$", description="base32 without padding, for manual entry"),
        "qrCode": s(pattern="^data:image/png;base64,"),
        "otpauthUrl": s(pattern="^otpauth://totp/"),
        "backupCodes": {"type": "array", "items": s(pattern="^[A-Z0-9]{10}$"),
                        "minItems": 10, "maxItems": 10,
                        "description": "valid once the method is verified"},
    }), "Pending for 15 minutes until verified", links={
        "VerifySetup": bearer_link("totpVerifySetup", "Confirm with a code of the new secret.",
                                   body={"secret": "$response.body#/data/secret"}, auth=AUTH_FROM_REQUEST),
        "VerifySetupVariant": bearer_link("totpVerify", "The same, by its variant path.",
                                          body={"secret": "$response.body#/data/secret"},
                                          auth=AUTH_FROM_REQUEST),
    })},
    scope("2fa:write")))
TOTP_VERIFY_BODY = obj({"code": OTP_CODE,
                        "secret": nullable(s(description="when given, must equal the pending secret"))},
                       required=["code"], extra=True)
for path, op_id, summary in [("/2fa/totp/verify-setup", "totpVerifySetup", "Confirm TOTP enrolment"),
                             ("/2fa/totp/verify", "totpVerify", "Confirm TOTP enrolment (variant path)")]:
    add(path, "post", op(
        op_id, summary, "totp", scoped("2fa:write"),
        {200: ok(obj({"enabled": {"const": True}, "method": {"const": "totp"}}), "TOTP enabled", links={
            "Methods": bearer_link("listMethods", "The methods now enabled.", auth=AUTH_FROM_REQUEST),
            "BackupCount": bearer_link("backupCodesCount", "The backup codes now valid.",
                                       auth=AUTH_FROM_REQUEST),
        })},
        {400: ["InvalidCode", "SetupNotInitiated"], **scope("2fa:write")}, body=TOTP_VERIFY_BODY))
add("/2fa/totp", "delete", op(
    "totpDelete", "Remove TOTP", "totp", scoped("2fa:write"),
    {200: ok(obj({"message": {"const": "TOTP disabled"}, "twoFactorEnabled": BOOL}),
             "Removed; when it was the last method 2FA is off and backup codes are void")},
    {404: ["NotFound"], **scope("2fa:write")}))

# --- SMS and e-mail
for channel, field, field_schema, not_configured in [
    ("sms", "phoneNumber", s(minLength=1, description="international format: + and 8-15 digits; "
                                                       "spaces, dots, dashes, parentheses ignored"),
     "SmsNotConfigured"),
    ("email", "email", s(minLength=1, format="email",
                         description="ASCII, at most 254 characters; surrounding white space is ignored"),
     "EmailNotConfigured"),
]:
    masked = s(description="masked")
    add(f"/2fa/{channel}/setup", "post", op(
        f"{channel}Setup", f"Start {channel} enrolment: a 6-digit code is sent", channel, scoped("2fa:write"),
        {200: ok(obj({field: masked, "codeSent": {"const": True}, "message": s()}), "Code sent (valid 300 s)",
                 links={"VerifySetup": bearer_link(f"{channel}VerifySetup", "Confirm with the code sent.",
                                                   auth=AUTH_FROM_REQUEST)})},
        {503: [not_configured, "DeliveryFailed"], **scope("2fa:write")},
        body=obj({field: field_schema}, extra=True)))
    add(f"/2fa/{channel}/verify-setup", "post", op(
        f"{channel}VerifySetup", f"Confirm {channel} enrolment", channel, scoped("2fa:write"),
        {200: ok(obj({"enabled": {"const": True}, "method": {"const": channel}, field: masked}))},
        {400: ["InvalidCode", "SetupNotInitiated"], **scope("2fa:write")},
        body=obj({"code": OTP_CODE}, extra=True)))

# --- Second factor at login
SEND_BODY = obj({"tempToken": s(minLength=1), "method": s(enum=["sms", "email"])}, extra=True)
for path, op_id, summary in [("/2fa/send-code", "sendCode", "Send a login code by SMS or e-mail"),
                             ("/2fa/resend", "resendCode", "Send a login code again (same as send-code)")]:
    add(path, "post", op(
        op_id, summary, "login-2fa", PUBLIC,
        {200: ok(obj({"codeSent": {"const": True}, "method": s(enum=["sms", "email"]),
                      "expiresIn": {"const": 300}}), "Code sent")},
        {400: ["InvalidTempToken", "NoMethod"], 503: ["SmsNotConfigured", "EmailNotConfigured", "DeliveryFailed"]},
        body=SEND_BODY,
        description="Limited per user: SMS 5 and e-mail 10 per hour."))
VERIFIED_LINKS = {
    "Me": bearer_link("getMe", "The user just signed in."),
    "Devices": bearer_link("listDevices", "Trusted devices (one was added with trustDevice)."),
    "BackupCount": bearer_link("backupCodesCount", "Backup codes left."),
}
add("/2fa/verify", "post", op(
    "verify", "Complete a 2FA login with a TOTP, SMS or e-mail code", "login-2fa", PUBLIC,
    {200: ok(obj({"accessToken": JWT, "refreshToken": JWT, "user": ref("User"),
                  "deviceToken": s(description="only with trustDevice: presented at login to skip 2FA "
                                               "for 30 days")},
                 required=["accessToken", "refreshToken", "user"]), "Signed in", COOKIE, links=VERIFIED_LINKS)},
    {400: ["InvalidTempToken", "InvalidCode", "NoMethod"]},
    body=obj({"tempToken": s(minLength=1), "code": OTP_CODE, "trustDevice": nullable(BOOL),
              "deviceName": nullable(s(description="trimmed, at most 100 characters kept; no control characters")),
              "method": nullable(s(enum=["totp", "sms", "email"], description="narrows the check to one method"))},
             required=["tempToken", "code"], extra=True),
    description="A temp token dies after 5 wrong codes and once exchanged; an account gets at most 20 "
                "consecutive failed second factors before verification is refused (429) for 15 minutes."))
REQUEST_OPTIONS = obj({
    "challenge": B64URL, "timeout": INT, "rpId": s(),
    "allowCredentials": {"type": "array", "items": obj(
        {"type": {"const": "public-key"}, "id": B64URL, "transports": {"type": "array", "items": s()}},
        required=["type", "id"])},
    "userVerification": s(enum=["preferred", "required"]),
})
add("/2fa/webauthn/options", "post", op(
    "webauthnLoginOptions", "Passkey request options for the second step of a login", "login-2fa", PUBLIC,
    {200: ok(REQUEST_OPTIONS, "PublicKeyCredentialRequestOptions in JSON form (for "
             "PublicKeyCredential.parseRequestOptionsFromJSON); the challenge is usable once, for 5 minutes")},
    {400: ["InvalidTempToken", "NoMethod"]},
    body=obj({"tempToken": s(minLength=1)}, extra=True)))
add("/2fa/verify-webauthn", "post", op(
    "verifyWebauthn", "Complete a 2FA login with a passkey", "login-2fa", PUBLIC,
    {200: ok(obj({"accessToken": JWT, "refreshToken": JWT, "user": ref("User"),
                  "deviceToken": s(description="only with trustDevice: presented at login to skip 2FA "
                                               "for 30 days")},
                 required=["accessToken", "refreshToken", "user"]), "Signed in", COOKIE, links=VERIFIED_LINKS)},
    {400: ["InvalidTempToken", "InvalidCode", "NoMethod", "PasskeyChallenge"]},
    body=obj({"tempToken": s(minLength=1),
              "credential": {"type": "object", "description": "the assertion's toJSON() form"},
              "trustDevice": nullable(BOOL),
              "deviceName": nullable(s(description="trimmed, at most 100 characters kept; no control characters"))},
             required=["tempToken", "credential"], extra=True),
    description="Checks challenge (single use), origin, RP ID hash, UP, the signature and the signature "
                "counter; a counter that does not increase is refused and audited as "
                "`webauthn_counter_regression`. Failures count like wrong codes."))
add("/auth/passkey/options", "post", op(
    "passkeyOptions", "Passkey request options for passwordless sign-in", "auth", PUBLIC,
    {200: ok(REQUEST_OPTIONS, "PublicKeyCredentialRequestOptions in JSON form, without allowCredentials "
             "(discoverable credentials) and with userVerification required; the challenge is usable once, "
             "for 5 minutes")},
    {}))
add("/auth/passkey/verify", "post", op(
    "passkeyVerify", "Passwordless sign-in with a passkey", "auth", PUBLIC,
    {200: ok(obj({"accessToken": JWT, "refreshToken": JWT, "user": ref("User")}),
             "Signed in; the session counts as multi-factor", COOKIE, links=VERIFIED_LINKS)},
    {400: ["PasskeyChallenge"]},
    body=obj({"credential": {"type": "object", "description": "the assertion's toJSON() form, "
                                                               "with its userHandle"}},
             required=["credential"], extra=True),
    description="The userHandle names the user; user verification (UV) is required."))
BACKUP_BODY = {
    "type": "object",
    "properties": {"tempToken": s(minLength=1), "backupCode": nullable(BACKUP_CODE),
                   "code": nullable({**BACKUP_CODE, "description": "variant name of backupCode"})},
    "required": ["tempToken"],
    "anyOf": [{"required": ["backupCode"]}, {"required": ["code"]}],
}
for path, op_id, summary in [("/2fa/verify-backup-code", "verifyBackupCode", "Complete a 2FA login with a backup code"),
                             ("/2fa/verify-backup", "verifyBackup", "Complete a 2FA login with a backup code (variant path)")]:
    add(path, "post", op(
        op_id, summary, "login-2fa", PUBLIC,
        {200: ok(obj({"accessToken": JWT, "refreshToken": JWT, "remainingCodes": INT, "user": ref("User")}),
                 "Signed in; the code is spent", COOKIE, links=VERIFIED_LINKS)},
        {400: ["InvalidTempToken", "InvalidCode", "BackupCodeUsed"]}, body=BACKUP_BODY))

# --- Backup codes, methods, devices
add("/2fa/backup-codes/generate", "post", op(
    "backupCodesGenerate", "A new set of 10 backup codes; earlier ones stop working", "backup-codes",
    scoped("2fa:write"),
    {200: ok(obj({"backupCodes": {"type": "array", "items": s(pattern="^[A-Z0-9]{10}$"),
                                  "minItems": 10, "maxItems": 10}}))},
    {400: ["NoMethod"], **scope("2fa:write")}))
add("/2fa/backup-codes/count", "get", op(
    "backupCodesCount", "Backup codes left", "backup-codes", scoped("2fa:read"),
    {200: ok(obj({"remaining": INT, "total": INT}))}, scope("2fa:read")))
# --- Passkeys (WebAuthn)
PASSKEY_NAME = s(minLength=1, maxLength=64, description="trimmed; no control characters")
add("/2fa/webauthn/register/options", "post", op(
    "webauthnRegisterOptions", "Start passkey enrolment", "webauthn", scoped("2fa:write"),
    {200: ok(obj({
        "rp": obj({"id": s(), "name": s()}),
        "user": obj({"id": B64URL, "name": s(), "displayName": s()}),
        "challenge": B64URL,
        "pubKeyCredParams": {"type": "array", "items": obj({"type": {"const": "public-key"},
                                                            "alg": {"type": "integer", "enum": [-7, -8, -257]}})},
        "timeout": INT,
        "excludeCredentials": {"type": "array", "items": obj(
            {"type": {"const": "public-key"}, "id": B64URL, "transports": {"type": "array", "items": s()}},
            required=["type", "id"])},
        "authenticatorSelection": obj({"residentKey": {"const": "preferred"},
                                       "requireResidentKey": {"const": False},
                                       "userVerification": {"const": "preferred"}}),
        "attestation": {"const": "none"},
        "extensions": obj({"credProps": {"const": True}}),
    }), "PublicKeyCredentialCreationOptions in JSON form (for PublicKeyCredential.parseCreationOptionsFromJSON); "
        "the challenge is usable once, for 5 minutes")},
    scope("2fa:write")))
add("/2fa/webauthn/register/verify", "post", op(
    "webauthnRegisterVerify", "Finish passkey enrolment", "webauthn", scoped("2fa:write"),
    {201: ok(obj({
        "credential": ref("Passkey"),
        "backupCodes": {"type": "array", "items": s(pattern="^[A-Z0-9]{10}$"), "minItems": 10, "maxItems": 10,
                        "description": "only when this is the user's first method"},
    }, required=["credential"]), "Stored; 2FA is on")},
    {400: ["PasskeyChallenge"], 409: ["PasskeyRegistered"], **scope("2fa:write")},
    body=obj({"credential": {"type": "object", "description": "the credential's toJSON() form"},
              "name": nullable(PASSKEY_NAME)}, required=["credential"], extra=True)))
add("/2fa/webauthn/credentials", "get", op(
    "webauthnCredentials", "The user's passkeys", "webauthn", scoped("2fa:read"),
    {200: ok(obj({"credentials": {"type": "array", "items": ref("Passkey")}}))},
    scope("2fa:read")))
add("/2fa/webauthn/credentials/{credentialId}", "patch", op(
    "webauthnRename", "Rename a passkey", "webauthn", scoped("2fa:write"),
    {200: ok(obj({"credential": ref("Passkey")}))},
    {404: ["NotFound"], **scope("2fa:write")},
    body=obj({"name": PASSKEY_NAME}, extra=True),
    params=[path_param("credentialId", "the passkey's id (UUID) in this service")]))
add("/2fa/webauthn/credentials/{credentialId}", "delete", op(
    "webauthnDelete", "Remove a passkey", "webauthn", scoped("2fa:write"),
    {200: ok(obj({"message": {"const": "Passkey removed"}, "twoFactorEnabled": BOOL}),
             "Removed; when it was the last method 2FA is off and backup codes are void")},
    {404: ["NotFound"], **scope("2fa:write")},
    params=[path_param("credentialId", "the passkey's id (UUID) in this service")]))
add("/2fa/methods", "get", op(
    "listMethods", "The user's second-factor methods", "methods", scoped("2fa:read"),
    {200: ok(obj({"methods": {"type": "array", "items": ref("Method")}}), links={
        "DeleteMethod": bearer_link("deleteMethod", "Remove one of them.",
                                    params={"path.methodId": "$response.body#/data/methods/0/id"},
                                    auth=AUTH_FROM_REQUEST)})},
    scope("2fa:read")))
add("/2fa/methods/{methodId}", "delete", op(
    "deleteMethod", "Remove a method", "methods", scoped("2fa:write"),
    {200: ok(obj({"message": {"const": "2FA method removed"}}))},
    {400: ["LastMethod"], 404: ["NotFound"], **scope("2fa:write")},
    params=[path_param("methodId", "a method id of this user")]))
add("/2fa/devices", "get", op(
    "listDevices", "Trusted devices, newest first", "devices", scoped("2fa:read"),
    {200: ok(obj({"devices": {"type": "array", "items": ref("Device")}}), links={
        "DeleteDevice": bearer_link("deleteDevice", "Forget one of them.",
                                    params={"path.deviceId": "$response.body#/data/devices/0/id"},
                                    auth=AUTH_FROM_REQUEST)})},
    scope("2fa:read")))
add("/2fa/devices", "delete", op(
    "deleteAllDevices", "Forget every trusted device", "devices", scoped("2fa:write"),
    {200: ok(obj({"message": {"const": "All trusted devices removed"}, "removedCount": INT}))},
    scope("2fa:write")))
add("/2fa/devices/{deviceId}", "delete", op(
    "deleteDevice", "Forget one trusted device", "devices", scoped("2fa:write"),
    {200: ok(obj({"message": {"const": "Device removed"}}))},
    {404: ["NotFound"], **scope("2fa:write")},
    params=[path_param("deviceId", "a trusted device id of this user")]))

# --- API keys
KEY_ID = path_param("apiKeyId", "an API key id of this user")
KEY_LINKS = {
    "Rotate": bearer_link("rotateApiKey", "A new secret for this key.",
                          params={"path.apiKeyId": "$response.body#/data/id"}, auth=AUTH_FROM_REQUEST),
    "Revoke": bearer_link("revokeApiKey", "Revoke this key.",
                          params={"path.apiKeyId": "$response.body#/data/id"}, auth=AUTH_FROM_REQUEST),
    "MeByKey": {"operationId": "getMe", "description": "Act as the owner with the new key.",
                "parameters": {"header.X-API-Key": "$response.body#/data/apiKey"}},
}
add("/api-keys", "get", op(
    "listApiKeys", "The user's API keys (never the keys themselves)", "api-keys", SESSION,
    {200: ok(obj({"apiKeys": {"type": "array", "items": ref("ApiKey")}}))}, {},
    description="Key management needs a session; an API key is refused (401)."))
add("/api-keys", "post", op(
    "createApiKey", "Create an API key", "api-keys", SESSION,
    {201: ok(ref("NewApiKey"), "Created; `apiKey` is shown only here", links=KEY_LINKS)}, {},
    body=obj({"name": s(minLength=1, description="at most 100 characters once surrounding white space "
                                                 "is trimmed; no control characters"),
              "scopes": {"type": "array", "items": s(enum=SCOPES), "minItems": 1},
              "expiresInDays": nullable({"type": "integer", "minimum": 1, "maximum": 3650})},
             required=["name", "scopes"], extra=True),
    description="At most 20 keys per user."))
add("/api-keys/{apiKeyId}", "delete", op(
    "revokeApiKey", "Revoke an API key", "api-keys", SESSION,
    {200: ok(obj({"message": {"const": "API key revoked"}}))}, {404: ["NotFound"]}, params=[KEY_ID]))
add("/api-keys/{apiKeyId}/rotate", "post", op(
    "rotateApiKey", "A new secret for an API key; the old one stops working", "api-keys", SESSION,
    {200: ok(ref("NewApiKey"), "Rotated; `apiKey` is shown only here", links=KEY_LINKS)},
    {404: ["NotFound"]}, params=[KEY_ID]))

# --- Audit log
add("/audit-log", "get", op(
    "auditLog", "The user's audit records, newest first", "audit", scoped("audit:read"),
    {200: ok(obj({"events": {"type": "array", "items": ref("AuditEvent")},
                  "nextCursor": nullable(s(pattern="^[0-9]+$", description="pass back as `cursor`; null at the end"))}),
             links={"NextPage": bearer_link("auditLog", "The next page.",
                                            params={"query.cursor": "$response.body#/data/nextCursor"},
                                            auth=AUTH_FROM_REQUEST)})},
    {400: ["Validation"], **scope("audit:read")},
    params=[{"name": "limit", "in": "query", "required": False,
             "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 50}},
            {"name": "cursor", "in": "query", "required": False,
             "schema": s(pattern="^[0-9]+$", description="`nextCursor` of the previous page")}]))

# --- Webhooks
HOOK_ID = path_param("webhookId", "a webhook id of this user")


def hook_link(op_id, description):
    return bearer_link(op_id, description, params={"path.webhookId": "$response.body#/data/id"},
                       auth=AUTH_FROM_REQUEST)


add("/webhooks", "get", op(
    "listWebhooks", "The user's webhooks", "webhooks", scoped("webhooks:read"),
    {200: ok(obj({"webhooks": {"type": "array", "items": ref("Webhook")}}))}, scope("webhooks:read")))
add("/webhooks", "post", op(
    "createWebhook", "Register a webhook", "webhooks", scoped("webhooks:write"),
    {201: ok(ref("NewWebhook"), "Registered; `secret` is shown only here", links={
        "Get": hook_link("getWebhook", "The new webhook."),
        "Test": hook_link("testWebhook", "Send it a test event."),
        "Deliveries": hook_link("webhookDeliveries", "Its delivery log."),
        "Delete": hook_link("deleteWebhook", "Delete it."),
        "VerifySignature": bearer_link("verifyWebhookSignature", "Check a signature made with its secret.",
                                       body={"webhookId": "$response.body#/data/id"}, auth=AUTH_FROM_REQUEST),
    })},
    scope("webhooks:write"),
    body=obj({"url": s(minLength=1, description="https (http outside production); no credentials; "
                                               "no loopback, private, link-local or internal host "
                                               "unless WEBHOOK_ALLOW_PRIVATE"),
              "events": {"type": "array", "items": s(enum=EVENTS), "minItems": 1}}, extra=True),
    description="At most 10 webhooks per user."))
add("/webhooks/events", "get", op(
    "webhookEvents", "The event names a webhook may subscribe to", "webhooks", PUBLIC,
    {200: ok(obj({"events": {"type": "array", "items": s(enum=EVENTS)}}))}, {}))
add("/webhooks/verify-signature", "post", op(
    "verifyWebhookSignature", "Check a delivery's signature", "webhooks", scoped("webhooks:read"),
    {200: ok(obj({"valid": {"const": True}}))},
    {400: ["InvalidSignature"], 404: ["NotFound"], **scope("webhooks:read")},
    body=obj({"webhookId": s(minLength=1), "payload": s(description="the raw body as a string"),
              "signature": s(minLength=1, description="hex HMAC-SHA-256, optionally prefixed `sha256=`")},
             extra=True)))
add("/webhooks/{webhookId}", "get", op(
    "getWebhook", "One webhook", "webhooks", scoped("webhooks:read"),
    {200: ok(ref("Webhook"))}, {404: ["NotFound"], **scope("webhooks:read")}, params=[HOOK_ID]))
add("/webhooks/{webhookId}", "delete", op(
    "deleteWebhook", "Delete a webhook and its delivery log", "webhooks", scoped("webhooks:write"),
    {200: ok(obj({"message": {"const": "Webhook deleted"}}))},
    {404: ["NotFound"], **scope("webhooks:write")}, params=[HOOK_ID]))
add("/webhooks/{webhookId}/test", "post", op(
    "testWebhook", "Queue a `webhook.test` event to this webhook", "webhooks", scoped("webhooks:write"),
    {200: ok(obj({"message": {"const": "Test event queued"}, "deliveryId": UUID}))},
    {404: ["NotFound"], **scope("webhooks:write")}, params=[HOOK_ID]))
add("/webhooks/{webhookId}/deliveries", "get", op(
    "webhookDeliveries", "The webhook's deliveries, newest first", "webhooks", scoped("webhooks:read"),
    {200: ok(obj({"deliveries": {"type": "array", "items": ref("Delivery")}}))},
    {404: ["NotFound"], **scope("webhooks:read")}, params=[HOOK_ID]))

DOC = {
    "openapi": "3.1.0",
    "info": {
        "title": "Two-factor authentication service",
        "version": "0.1.0",
        "description": (
            "Registration and login, second factors (TOTP, SMS, e-mail, backup codes), trusted devices, "
            "sessions, API keys, audit log and webhooks.\n\n"
            "Every response except health and this document is an envelope: `{ success: true, data }` or "
            "`{ success: false, error: <message> }`; each error response below lists its exact messages. "
            "An unknown path is 404 `Resource not found`; another method on a known path is 405 "
            "`Method not allowed` with `Allow`; `OPTIONS` on a known path is the CORS preflight (204). "
            "Bodies are JSON objects of at most 64 KiB; fields not named here are ignored, and `null` "
            "counts as absent. Rate-limited operations carry `X-RateLimit-*` headers (when limits are "
            "enabled) and `Retry-After` on 429."
        ),
    },
    "servers": [{"url": "/api", "description": "this service (API_BASE_PATH)"}],
    "tags": [{"name": t} for t in ["meta", "health", "auth", "totp", "sms", "email", "login-2fa",
                                   "webauthn", "backup-codes", "methods", "devices", "api-keys", "audit", "webhooks"]],
    "paths": P,
    "components": {
        "schemas": SCHEMAS,
        "responses": dict(sorted(RESPONSES.items())),
        "securitySchemes": {
            "bearerAuth": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT",
                           "description": "Access token (15 minutes) from register, login, verify or refresh."},
            "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "X-API-Key",
                             "description": "An API key (`tfa_` + 40 base62 characters); acts as its owner, "
                                            "limited by its scopes (403 names the missing scope)."},
            "apiKeyBearer": {"type": "http", "scheme": "bearer", "bearerFormat": "tfa_ API key",
                             "description": "The same API key as `Authorization: Bearer tfa_…`."},
            "refreshCookie": {"type": "apiKey", "in": "cookie", "name": "refreshToken",
                              "description": "Refresh token cookie (HttpOnly, SameSite=Strict, Path={base}/auth); "
                                             "requests using it must carry an allowed `Origin` (CSRF)."},
        },
        "headers": {
            "X-RateLimit-Limit": {"description": "the limit of the window", "schema": {"type": "integer"}},
            "X-RateLimit-Remaining": {"description": "requests left in the window", "schema": {"type": "integer"}},
            "X-RateLimit-Reset": {"description": "Unix time (s) at which the window resets",
                                  "schema": {"type": "integer"}},
            "Retry-After": {"description": "seconds until the window resets", "required": True,
                            "schema": {"type": "integer", "minimum": 1}},
            "Set-Cookie": {"description": "`refreshToken=…; HttpOnly; SameSite=Strict; Path={base}/auth; "
                                          "Max-Age=604800` (`Secure` in production); cleared with Max-Age=0",
                           "schema": {"type": "string"}},
        },
    },
}


def pretty(value, depth, indent=""):
    """JSON with objects laid out one member a line down to `depth` levels,
    compact below: one line per operation, schema or response keeps diffs
    readable and the compiled-in text small."""
    if depth == 0 or not isinstance(value, dict) or not value:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    inner = indent + "  "
    members = [f"{inner}{json.dumps(k)}: {pretty(v, depth - 1, inner)}" for k, v in value.items()]
    return "{\n" + ",\n".join(members) + "\n" + indent + "}"


def render():
    return pretty(DOC, 4) + "\n"


if __name__ == "__main__":
    text = render()
    if "--check" in sys.argv[1:]:
        if OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale: run scripts/openapi.py", file=sys.stderr)
            sys.exit(1)
        print(f"{OUT} is up to date")
    else:
        OUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUT}")
