#!/usr/bin/env python3
"""Checks that core's imports run one way (docs/architecture.md, "Layers").

    core/src/service.rs   the driver: may use contract/, plumbing/, crypto/,
                          and api/ only through its door (api/mod.rs's own
                          functions), never an endpoint module
    core/src/api/         endpoints: may use everything below
    core/src/plumbing/    may use contract/ and crypto/; never api/
    core/src/contract/    may use crypto/; never plumbing/ or api/
    core/src/crypto/      may use contract::ports (the Rng); nothing else above

Only code counts: comment lines (`//`, `//!`, `///`) may link anywhere.
`testing.rs` and `testing/` (the test harness behind the `testing` feature)
are exempt. Exit status 1 and one line per violation when a rule is broken.

`--self-test` copies core/src to a temporary folder, plants one violation of
each rule, and checks that each is reported (so the check cannot silently
pass everything).
"""

import pathlib
import re
import shutil
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent / "core" / "src"


def endpoint_modules(src):
    return sorted(p.stem for p in (src / "api").glob("*.rs") if p.stem != "mod")


def code_lines(path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith("//"):
            continue
        yield n, line


def check(src):
    endpoints = endpoint_modules(src)
    # `api::users`, `api::{users, ...}`, `crate::api::users::...`.
    names_endpoint = re.compile(r"\bapi::(\{|(" + "|".join(endpoints) + r")\b)")
    any_api = re.compile(r"\bcrate::api\b|\bsuper::super::api\b")
    any_plumbing = re.compile(r"\bcrate::plumbing\b")
    above_ports = re.compile(r"\bcrate::contract::(?!ports\b)")
    problems = []

    def scan(path, rules):
        rel = path.relative_to(src)
        for n, line in code_lines(path):
            for pattern, what in rules:
                if pattern.search(line):
                    problems.append(f"core/src/{rel}:{n}: {what}: {line.strip()}")

    for path in sorted(src.rglob("*.rs")):
        rel = path.relative_to(src)
        top = rel.parts[0]
        if top in ("api", "testing", "testing.rs"):
            continue
        if top in ("service.rs", "lib.rs"):
            scan(path, [(names_endpoint, "names an endpoint module (use api's door)")])
        elif top == "plumbing":
            scan(path, [(any_api, "plumbing imports api")])
        elif top == "contract":
            scan(
                path,
                [
                    (any_api, "contract imports api"),
                    (any_plumbing, "contract imports plumbing"),
                ],
            )
        elif top == "crypto":
            scan(
                path,
                [
                    (any_api, "crypto imports api"),
                    (any_plumbing, "crypto imports plumbing"),
                    (above_ports, "crypto imports the contract beyond ports"),
                ],
            )
        else:
            problems.append(f"core/src/{rel}: outside the layers (add it to a folder)")
    return problems


def self_test():
    plants = {
        "plumbing/web.rs": "use crate::api::users;\n",
        "contract/error.rs": "use crate::plumbing::records;\n",
        "crypto/qr.rs": "use crate::contract::config::Config;\n",
        "service.rs": "use crate::api::otp::Channel;\n",
    }
    ok = True
    for rel, line in plants.items():
        with tempfile.TemporaryDirectory() as tmp:
            copy = pathlib.Path(tmp) / "src"
            shutil.copytree(ROOT, copy)
            target = copy / rel
            target.write_text(line + target.read_text())
            found = [p for p in check(copy) if p.startswith(f"core/src/{rel}:1:")]
            print(f"planted in {rel}: {'reported' if found else 'NOT REPORTED'}")
            ok = ok and bool(found)
    return ok


def main():
    if "--self-test" in sys.argv[1:]:
        if not self_test():
            sys.exit(1)
    problems = check(ROOT)
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} import(s) against the layer rules (docs/architecture.md)")
        sys.exit(1)
    print("core's layers: imports run one way")


if __name__ == "__main__":
    main()
