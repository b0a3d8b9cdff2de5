#!/usr/bin/env bash
# Fails, naming the crate and the dependency, when a crate declares
# a dependency it does not use. scripts/test.sh runs it before the whole test
# suite, so the gate and .ci/run do. The way cargo-machete works, with
# nothing to install: for every crate `cargo metadata --no-deps` lists (the
# workspace's, and fuzz/, a workspace of its own), each entry must be named
# by its Rust name (dashes as underscores; the key, for a `package =` rename)
# as a path (`name::`), in `use name`, in `extern crate name` or as an
# attribute's path (`with = "name"`), in these files or those they include
# with #[path]:
#   - a [dependencies] entry in src/ (the library and binaries);
#   - a [dev-dependencies] entry in src/, tests/, benches/ or examples/;
#   - a [build-dependencies] entry in build.rs.
# Plain `//` comments do not count; doc comments do (doctests compile them).
# It also fails on a [dev-dependencies] entry that repeats a [dependencies]
# one without adding features, and on a [workspace.dependencies] entry
# no crate inherits. A dependency used only through generated code, a macro
# or a feature goes in ALLOWED below, with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 - <<'PY'
import json, os, re, subprocess, sys, tomllib

# crate -> [dependencies] entry -> why it is needed although src/ never
# names it.
ALLOWED = {
    "runyard-allocator-api": {
        # the gRPC messages, client and server build.rs generates (included
        # in src/lib.rs) derive ::prost::Message and encode with
        # ::tonic_prost::ProstCodec
        "prost": "generated gRPC code",
        "tonic-prost": "generated gRPC code",
    },
    "runyard-events": {
        # the event types build.rs generates (included in src/lib.rs) derive
        # ::prost::Message
        "prost": "generated protobuf code",
    },
}

comment = re.compile(r"(?<![:/])//(?![/!]).*$", re.M)
path_attr = re.compile(r"#\[path\s*=\s*\"([^\"]+)\"\]")
failed = 0

def read(files):
    """The files, and those they include with #[path], without // comments."""
    text, seen, todo = [], set(), sorted(set(files))
    while todo:
        f = os.path.normpath(todo.pop())
        if f in seen or not os.path.isfile(f):
            continue
        seen.add(f)
        with open(f, encoding="utf-8") as fh:
            code = comment.sub("", fh.read())
        text.append(code)
        todo += [os.path.join(os.path.dirname(f), p) for p in path_attr.findall(code)]
    return "\n".join(text)

def walk(*dirs):
    files = []
    for d in dirs:
        for dirpath, _, names in os.walk(d):
            files += [os.path.join(dirpath, n) for n in names if n.endswith(".rs")]
    return files

def uses(code, key):
    ident = re.escape(key.replace("-", "_"))
    return re.search(
        rf"(?<![\w:])(?:::)?{ident}::"
        rf"|\buse\s+(?:::)?{ident}\b"
        rf"|\bextern\s+crate\s+{ident}\b"
        # a path in an attribute: #[serde(with = "humantime_serde")]
        rf"|=\s*\"(?:::)?{ident}(?:::|\")",
        code,
    ) is not None

SECTION = {"normal": "dependencies", "dev": "dev-dependencies", "build": "build-dependencies"}

def check(manifest):
    """Checks the workspace of `manifest`; returns its crates' names."""
    global failed
    run = subprocess.run(
        ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline",
         "--manifest-path", manifest],
        stdout=subprocess.PIPE, text=True)
    if run.returncode != 0:
        sys.exit(f"check-deps: cargo metadata --manifest-path {manifest} failed (its message is above)")
    meta = json.loads(run.stdout)
    members = set(meta["workspace_members"])
    crates = {p["name"]: p for p in meta["packages"] if p["id"] in members}
    for name, pkg in sorted(crates.items()):
        root = os.path.dirname(pkg["manifest_path"])
        rel = os.path.relpath(root)
        src = os.path.join(root, "src")
        product = walk(src) + [
            t["src_path"] for t in pkg["targets"]
            if {"lib", "bin", "proc-macro"} & set(t["kind"])
        ]
        build = [os.path.join(root, "build.rs")] if os.path.isfile(os.path.join(root, "build.rs")) else []
        code = {
            "normal": read(product),
            # unit tests in src/ see the dev-dependencies too
            "dev": read(product + walk(*(os.path.join(root, d) for d in ("tests", "benches", "examples")))
                        + [t["src_path"] for t in pkg["targets"] if {"test", "bench", "example"} & set(t["kind"])]),
            "build": read(build),
        }
        allowed = ALLOWED.get(name, {})
        declared = {}
        for dep in pkg["dependencies"]:
            key = dep.get("rename") or dep["name"]
            kind = dep["kind"] or "normal"
            declared[(kind, key)] = dep
            if kind == "normal" and key in allowed:
                if uses(code[kind], key):
                    print(f"{rel} ({name}): {key} is used; drop it from ALLOWED in scripts/check-deps.sh", file=sys.stderr)
                    failed = 1
                continue
            if not uses(code[kind], key):
                where = {"normal": "src/", "dev": "src/, tests/, benches/ or examples/", "build": "build.rs"}[kind]
                print(f"{rel} ({name}): [{SECTION[kind]}] {key} is never used in {where}", file=sys.stderr)
                failed = 1
        # a dev-dependency that repeats a dependency without adding features
        for (kind, key), dep in declared.items():
            normal = declared.get(("normal", key))
            if kind == "dev" and normal is not None and set(dep["features"]) <= set(normal["features"]) \
                    and (normal["uses_default_features"] or not dep["uses_default_features"]):
                print(f"{rel} ({name}): [dev-dependencies] {key} repeats [dependencies] {key}", file=sys.stderr)
                failed = 1
        for key in allowed:
            if ("normal", key) not in declared:
                print(f"{rel} ({name}): {key} is allowed in scripts/check-deps.sh but not in [dependencies]", file=sys.stderr)
                failed = 1
    # a [workspace.dependencies] entry no crate inherits
    with open(manifest, "rb") as fh:
        inherited = tomllib.load(fh).get("workspace", {}).get("dependencies", {})
    keys = {d.get("rename") or d["name"] for p in crates.values() for d in p["dependencies"]}
    for key in sorted(set(inherited) - keys):
        print(f"{manifest}: [workspace.dependencies] {key} is used by no crate", file=sys.stderr)
        failed = 1
    return set(crates)

# the workspace, and the fuzz crate, a workspace of its own
crates = check("Cargo.toml") | check("fuzz/Cargo.toml")
for name in ALLOWED:
    if name not in crates:
        print(f"scripts/check-deps.sh allows dependencies of {name}, which is no crate here", file=sys.stderr)
        failed = 1
sys.exit(failed)
PY
