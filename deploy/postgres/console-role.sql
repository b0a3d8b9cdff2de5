-- The console's database login: runyard_console, a member of the NOLOGIN
-- group role runyard_reader and nothing else. The job-tracker's migrations
-- grant runyard_reader SELECT on every table of the projection each time
-- they run (at every start and rebuild), so the console can read what a
-- later migration adds and can never write: it refuses to start as a
-- superuser or as a role that may INSERT, UPDATE, DELETE or TRUNCATE any
-- table.
--
-- Run once as a superuser (or a role with CREATEROLE), with the login's
-- password in the psql variable `password`:
--
--   psql "postgres://postgres@db:5432/runyard" \
--     -v password="$RUNYARD_POSTGRES_CONSOLE_PASSWORD" -f deploy/postgres/console-role.sql
--
-- docker-compose.yml's postgres runs it when it first makes its data volume
-- (deploy/postgres/console-role.sh); on a volume made before:
--
--   docker compose exec -T postgres psql -U postgres -d runyard -v ON_ERROR_STOP=1 \
--     -v password="$RUNYARD_POSTGRES_CONSOLE_PASSWORD" < deploy/postgres/console-role.sql
--
-- Running it again changes nothing but the password (a rotation: run it
-- with the new one, then give the console its new RUNYARD_DATABASE_URL).
-- Restart the job-tracker once after the first run on a database it has
-- already migrated: it grants the new group role when it starts.

\set ON_ERROR_STOP on

-- Without a password (or with a short one) the role would have none that
-- works: refuse, naming what to give.
\if :{?password}
\else
\set password ''
\endif
SELECT length(:'password') < 32 AS weak \gset
\if :weak
DO $$
BEGIN
    RAISE EXCEPTION 'console-role.sql: give runyard_console a password of 32 characters or more: psql -v password="$RUNYARD_POSTGRES_CONSOLE_PASSWORD" (scripts/gen-secrets.sh makes one)';
END $$;
\endif

-- psql does not fill in :'password' inside a $$ body, so the roles are made
-- there and the password set outside, with the value quoted by psql.
DO $$
BEGIN
    CREATE ROLE runyard_reader NOLOGIN;
EXCEPTION WHEN duplicate_object THEN
    NULL;
END $$;

DO $$
BEGIN
    CREATE ROLE runyard_console LOGIN IN ROLE runyard_reader;
EXCEPTION WHEN duplicate_object THEN
    NULL;
END $$;

-- Also for a runyard_console made before by hand: a member, a login.
GRANT runyard_reader TO runyard_console;
ALTER ROLE runyard_console LOGIN PASSWORD :'password';
-- Every session read-only, whatever the client asks (the console asks it
-- too).
ALTER ROLE runyard_console SET default_transaction_read_only = on;
