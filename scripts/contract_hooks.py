"""Schemathesis hooks for scripts/test-contract.sh.

Steers *positive* test cases (those Schemathesis means to be valid) towards
what the service accepts where the OpenAPI document cannot say it exactly,
so that the stateful phase gets past its first step more often:

* registration passwords need an upper- and a lower-case letter of any
  script, which JSON Schema's regular expressions cannot state portably
  (the document states the digit and the special character only);
* webhook URLs must name a public host, which no schema keyword can check.

Negative cases are never touched: they must stay as generated, so that an
accepted one is a real finding.
"""

import schemathesis


@schemathesis.hook
def map_case(context, case):
    meta = getattr(case, "meta", None)
    if meta is None or meta.generation.mode.is_negative:
        return case
    op = case.operation
    body = case.body
    if not isinstance(body, dict):
        return case
    if op.method.upper() == "POST" and op.path == "/auth/register":
        pw = body.get("password")
        if isinstance(pw, str) and len(pw) <= 126:
            body["password"] = pw + "Aa"
    elif op.method.upper() == "POST" and op.path == "/webhooks":
        if isinstance(body.get("url"), str):
            body["url"] = "https://hooks.example.com/contract"
    return case
