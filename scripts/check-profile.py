#!/usr/bin/env python3
"""Keeps Cargo.toml's list of build-time-only packages complete and current.

The dev profile builds every dependency at opt-level 3 (`package."*"`), and
cargo ranks that above `build-override`, so the proc macros, build scripts and
what only they use are named one by one at opt-level 0. This script derives
that set from `cargo tree` and fails when the list lacks one (a new proc macro
would quietly cost build time again) or names one that is no longer
build-time-only (it would run unoptimised in the tests).

Build-time-only: reached by `cargo tree -e normal,build,dev` from the
workspace, for any target, but not by `-e normal,dev,no-proc-macro`.
"""
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def packages(edges):
    out = subprocess.run(
        ["cargo", "tree", "--workspace", "--target", "all", "--locked",
         "-e", edges, "-f", "{p}", "--prefix", "none"],
        cwd=ROOT, check=True, capture_output=True, text=True).stdout
    found = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].startswith("v"):
            found.add((parts[0], parts[1][1:]))
    return found


def main():
    every = packages("normal,build,dev")
    runtime = packages("normal,dev,no-proc-macro")
    build_only = every - runtime
    runtime_names = {name for name, _ in runtime}
    # A name with a twin that runs must be pinned to its version.
    want = {f"{n}:{v}" if n in runtime_names else n for n, v in build_only}

    profile = tomllib.loads((ROOT / "Cargo.toml").read_text())["profile"]["dev"]
    listed = {spec for spec, cfg in profile.get("package", {}).items()
              if spec != "*" and cfg.get("opt-level") == 0}
    # Windows-only proc macros are never built here; listing them is optional.
    optional = {s for s in want if s.startswith("windows-")}
    missing = sorted(want - listed - optional)
    extra = sorted(listed - want)
    for spec in missing:
        print(f"Cargo.toml: [profile.dev.package.{spec}] opt-level = 0 is missing "
              "(a build-time-only package)")
    for spec in extra:
        print(f"Cargo.toml: [profile.dev.package.{spec}] is at opt-level 0 but the "
              "tests run it (or it is no longer a dependency)")
    if missing or extra:
        sys.exit(1)
    print(f"profile: {len(listed)} build-time-only packages at opt-level 0")


if __name__ == "__main__":
    main()
