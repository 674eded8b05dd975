#!/usr/bin/env bash
# The API client walkthrough of README.md, as one script: register, enable
# TOTP (QR code saved as a PNG), log in with a code, refresh (cookie, then
# body), trust a device and log in without a code, log in with a backup code,
# create an API key and introspect a token with it (what the edge filter does).
#
#   examples/walkthrough.sh [BASE_URL [ORIGIN]]
#
# BASE_URL defaults to http://127.0.0.1:3001/api. ORIGIN, when given, must be
# listed in the server's CORS_ORIGINS: the refresh by cookie is checked
# against CSRF and needs it (without it, only the refresh by body runs).
#
# Needs curl, jq and python3 (for the TOTP code). Every call is checked: the
# script stops at the first answer without "success": true. Files (cookie
# jar, QR code) go to a temporary directory, removed on exit. A fresh user
# name per run, so it can be run again against the same server (within the
# rate limits: 5 registrations and 5 logins per 15 minutes per address).
# scripts/test-docs.sh runs it against a freshly started local host, and
# checks that README.md shows these same commands.
set -euo pipefail

B="${1:-http://127.0.0.1:3001/api}"
ORIGIN="${2:-}"   # an origin listed in CORS_ORIGINS: enables the cookie refresh of step 4
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# Fails loudly unless the answer (stdin) is {"success": true, ...}; prints it.
ok() {
  local body
  body="$(cat)"
  if ! jq -e '.success == true' >/dev/null 2>&1 <<<"$body"; then
    echo "walkthrough: $1 failed: $body" >&2
    exit 1
  fi
  printf '%s\n' "$body"
}

# The TOTP code an authenticator app shows (RFC 6238: SHA-1, 6 digits, 30 s);
# $2 = steps ahead (1 = the next 30-second window).
totp() {
  python3 -c 'import sys,time,hmac,struct,base64
s=sys.argv[1]; key=base64.b32decode(s+"="*(-len(s)%8))
msg=struct.pack(">Q", int(time.time())//30+int(sys.argv[2]))
h=hmac.new(key,msg,"sha1").digest(); o=h[-1]&15
print("%06d" % ((struct.unpack(">I",h[o:o+4])[0]&0x7fffffff)%1000000))' "$1" "${2:-0}"
}

NAME="alice$(date +%s)$RANDOM"
PASS='Str0ng!Passw0rd'
J='Content-Type: application/json'

echo "== 1. register $NAME"
REG=$(curl -sS "$B/auth/register" -H "$J" \
  -d "{\"email\":\"$NAME@example.com\",\"username\":\"$NAME\",\"password\":\"$PASS\"}" | ok register)
ACCESS=$(jq -r .data.accessToken <<<"$REG")

echo "== 2. enable TOTP: setup returns the secret, the QR code and 10 backup codes"
SETUP=$(curl -sS -X POST "$B/2fa/totp/setup" -H "Authorization: Bearer $ACCESS" | ok totp-setup)
SECRET=$(jq -r .data.secret <<<"$SETUP")
BACKUP=$(jq -r '.data.backupCodes[0]' <<<"$SETUP")
jq -r .data.otpauthUrl <<<"$SETUP"                      # the URI inside the QR code
jq -r .data.qrCode <<<"$SETUP" | sed 's/^data:image\/png;base64,//' | base64 -d > "$WORK/totp-qr.png"
head -c 8 "$WORK/totp-qr.png" | od -An -c                # a PNG: 211   P   N   G ...
# scan totp-qr.png with an authenticator app; here the code is computed from the secret
curl -sS "$B/2fa/totp/verify-setup" -H "Authorization: Bearer $ACCESS" -H "$J" \
  -d "{\"code\":\"$(totp "$SECRET")\"}" | ok verify-setup

echo "== 3. log in: the password gives a temp token, the code gives the session"
LOGIN=$(curl -sS "$B/auth/login" -H "$J" \
  -d "{\"emailOrUsername\":\"$NAME\",\"password\":\"$PASS\"}" | ok login)
jq -c '{requiresTwoFactor: .data.requiresTwoFactor, availableMethods: .data.availableMethods}' <<<"$LOGIN"
TEMP=$(jq -r .data.tempToken <<<"$LOGIN")
# a code is accepted once: use the next window's code (one step either side is accepted)
VERIFY=$(curl -sS -c "$WORK/cookies" "$B/2fa/verify" -H "$J" \
  -d "{\"tempToken\":\"$TEMP\",\"code\":\"$(totp "$SECRET" 1)\",\"trustDevice\":true,\"deviceName\":\"my laptop\"}" | ok verify)
ACCESS=$(jq -r .data.accessToken <<<"$VERIFY")
DEVICE=$(jq -r .data.deviceToken <<<"$VERIFY")
curl -sS "$B/auth/me" -H "Authorization: Bearer $ACCESS" | ok me | jq -c '.data | {username, twoFactorEnabled}'

echo "== 4. refresh: with the HttpOnly cookie (browsers), or with the token in the body"
if [ -n "$ORIGIN" ]; then
  REFRESHED=$(curl -sS -X POST -b "$WORK/cookies" -c "$WORK/cookies" "$B/auth/refresh" \
    -H "Origin: $ORIGIN" | ok refresh-cookie)
  REFRESH=$(jq -r .data.refreshToken <<<"$REFRESHED")
else
  echo "(no ORIGIN given: skipping the cookie refresh)"
  REFRESH=$(jq -r .data.refreshToken <<<"$VERIFY")
fi
REFRESHED=$(curl -sS "$B/auth/refresh" -H "$J" -d "{\"refreshToken\":\"$REFRESH\"}" | ok refresh-body)
ACCESS=$(jq -r .data.accessToken <<<"$REFRESHED")

echo "== 5. trusted device: the device token skips the second factor"
curl -sS "$B/auth/login" -H "$J" \
  -d "{\"emailOrUsername\":\"$NAME\",\"password\":\"$PASS\",\"deviceToken\":\"$DEVICE\"}" \
  | ok login-trusted | jq -e '.data.accessToken | length > 0' >/dev/null
curl -sS "$B/2fa/devices" -H "Authorization: Bearer $ACCESS" | ok devices | jq -c '[.data.devices[].deviceName]'

echo "== 6. backup code: log in without the authenticator app"
TEMP=$(curl -sS "$B/auth/login" -H "$J" \
  -d "{\"emailOrUsername\":\"$NAME\",\"password\":\"$PASS\"}" | ok login | jq -r .data.tempToken)
curl -sS "$B/2fa/verify-backup-code" -H "$J" \
  -d "{\"tempToken\":\"$TEMP\",\"backupCode\":\"$BACKUP\"}" | ok backup-code | jq -c '{remainingCodes: .data.remainingCodes}'

echo "== 7. an API key for services: the edge filter's introspection (scope auth:introspect)"
KEY=$(curl -sS "$B/api-keys" -H "Authorization: Bearer $ACCESS" -H "$J" \
  -d '{"name":"edge filter","scopes":["auth:introspect"]}' | ok api-key | jq -r .data.apiKey)
curl -sS "$B/auth/introspect" -H "X-API-Key: $KEY" -H "$J" -d "{\"token\":\"$ACCESS\"}" \
  | ok introspect | jq -c '.data | {active, mfa}'

echo "walkthrough: all steps succeeded"
