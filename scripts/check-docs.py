#!/usr/bin/env python3
"""Static checks of README.md and docs/ against the code (run by scripts/test-docs.sh).

1. README.md opens with the two commands (serve.sh, test.sh).
2. Every ```sh block of the README's API-client section appears, as
   consecutive lines, in examples/walkthrough.sh (which the test runs).
3. Every field of the filter's configuration (the Raw* structs of
   edge-filter/src/config.rs) is documented, as `field`, in the README's
   Envoy section or in edge-filter/README.md.
4. Every setting the service reads (SETTING_NAMES in core/src/contract/config.rs) and
   every setting of the local host (host/src/lib.rs) is documented, as
   `NAME`, in the README's deployer section or in docs/.
5. Relative links in README.md and docs/*.md point at files that exist.

Prints one line per problem and exits 1 if there is any.
"""

import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
problems = []


def read(rel):
    return (ROOT / rel).read_text(encoding="utf-8")


def section(text, heading_prefix):
    """The text of the level-2 section whose heading starts with heading_prefix."""
    lines = text.splitlines()
    out, inside = [], False
    for line in lines:
        if line.startswith("## "):
            if inside:
                break
            inside = line[3:].startswith(heading_prefix)
            continue
        if inside:
            out.append(line)
    if not out:
        problems.append(f"README.md: no section '## {heading_prefix}…'")
    return "\n".join(out)


def sh_blocks(text):
    return [m.group(1).splitlines() for m in re.finditer(r"```sh\n(.*?)```", text, re.S)]


def contains_run(haystack, needle):
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


readme = read("README.md")

# 1. The two commands at the very top.
top = sh_blocks(readme)[:1]
if not top or [l.split("#")[0].strip() for l in top[0]] != ["./scripts/serve.sh", "./scripts/test.sh"]:
    problems.append("README.md: the first block must be ./scripts/serve.sh and ./scripts/test.sh")

# 2. The walkthrough commands are the script's.
script = [l.rstrip() for l in read("examples/walkthrough.sh").splitlines()]
client = section(readme, "For API clients")
blocks = sh_blocks(client)
if len(blocks) < 6:
    problems.append(f"README.md: API-client section has {len(blocks)} sh blocks, expected at least 6")
for i, block in enumerate(blocks, 1):
    block = [l.rstrip() for l in block]
    if not contains_run(script, block):
        problems.append(
            f"README.md: API-client block {i} (starting {block[0]!r}) is not in examples/walkthrough.sh"
        )

# 3. Filter configuration fields.
config_rs = read("edge-filter/src/config.rs")
fields = []
for struct in ("RawConfig", "RawRule", "RawIntrospection"):
    m = re.search(r"struct " + struct + r" \{(.*?)\n\}", config_rs, re.S)
    if not m:
        problems.append(f"edge-filter/src/config.rs: struct {struct} not found")
        continue
    fields += [(struct, f) for f in re.findall(r"^\s*(\w+):", m.group(1), re.M)]
if len(fields) < 20:
    problems.append(f"edge-filter/src/config.rs: only {len(fields)} fields found")
operator_docs = section(readme, "For Envoy operators") + read("edge-filter/README.md")
for struct, f in fields:
    if f"`{f}`" not in operator_docs:
        problems.append(f"filter field `{f}` ({struct}) is documented neither in README.md nor in edge-filter/README.md")

# 4. Settings of the service and of the local host.
core_cfg = read("core/src/contract/config.rs")
m = re.search(r"pub const SETTING_NAMES: &\[&str\] = &\[(.*?)\];", core_cfg, re.S)
settings = re.findall(r'"([A-Z0-9_]+)"', m.group(1)) if m else []
if len(settings) < 20:
    problems.append(f"core/src/contract/config.rs: only {len(settings)} setting names found")
host_settings = sorted(set(re.findall(r'get\("([A-Z0-9_]+)"\)', read("host/src/lib.rs"))))
if len(host_settings) < 5:
    problems.append(f"host/src/lib.rs: only {len(host_settings)} host settings found")
deploy_docs = section(readme, "For deployers") + "".join(
    p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))
)
for name in settings + host_settings:
    if f"`{name}`" not in deploy_docs:
        problems.append(f"setting `{name}` is documented neither in README.md's deployer section nor in docs/")

# 4b. Outbound calls (issue #14): the wildcard webhook entry in spin.toml, the
# network-level block list in both runtime configs and the SpinKube manifest,
# and the README's deployer section saying what it covers.
if not re.search(r'(?m)^allowed_outbound_hosts = \[[^\]\n]*"https://\*:443"', read("spin.toml")):
    problems.append('spin.toml: allowed_outbound_hosts lacks "https://*:443" (webhooks)')
for rel in ["runtime-config.redis.toml", "runtime-config.sqlite.toml", "deploy/spinkube.yaml"]:
    text = read(rel)
    if "[outbound_networking]" not in text or not re.search(r'block_networks = \[[^\]]*"private"', text):
        problems.append(f'{rel}: no [outbound_networking] block_networks = ["private", ...]')
deployer = re.sub(r"\s+", " ", section(readme, "For deployers"))
for needle in ["block_networks", "runtime-config.redis.toml", "runtime-config.sqlite.toml",
               "https://*:443", "WEBHOOK_ALLOW_PRIVATE", "169.254.169.254", "does not cover"]:
    if needle not in deployer:
        problems.append(f"README.md deployer section does not mention {needle!r}")
try:
    import tomllib
    for rel in ["runtime-config.redis.toml", "runtime-config.sqlite.toml", "spin.toml"]:
        tomllib.loads(read(rel))
except ImportError:
    pass
except Exception as e:  # noqa: BLE001 - any parse error is a problem
    problems.append(f"a TOML file does not parse: {e}")

# 5. Relative links.
for rel in ["README.md"] + [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").glob("*.md"))]:
    base = (ROOT / rel).parent
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", read(rel)):
        if re.match(r"^[a-z]+:", target):
            continue
        if not (base / target).exists():
            problems.append(f"{rel}: link to {target} does not resolve")

print(
    f"checked: {len(blocks)} walkthrough blocks, {len(fields)} filter fields, "
    f"{len(settings)} service settings, {len(host_settings)} host settings"
)
for p in problems:
    print("problem:", p)
sys.exit(1 if problems else 0)
