#!/bin/sh
# docker-compose.yml mounts this into the postgres image's
# /docker-entrypoint-initdb.d: when the image first makes its data volume, it
# makes the console's read-only login from console-role.sql (mounted at
# /etc/runyard/console-role.sql, outside that directory, since the image would
# run a .sql there without the password) with the password compose passes the
# postgres service. On a volume made before, run console-role.sql by hand
# (its header says how).
: "${RUNYARD_POSTGRES_CONSOLE_PASSWORD:?not set (make .env with bash scripts/gen-secrets.sh > .env)}"
psql -v ON_ERROR_STOP=1 --no-psqlrc --username "${POSTGRES_USER:-postgres}" --dbname "${POSTGRES_DB:-runyard}" \
  -v password="$RUNYARD_POSTGRES_CONSOLE_PASSWORD" -f /etc/runyard/console-role.sql
