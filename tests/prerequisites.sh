#!/usr/bin/env bash
# What `make test` needs beside the virtual environment, provided where this script can, else named:
#
# - a Chromium for the dashboard's browser tests ($EVALD_CHROMIUM, default Debian's /usr/bin/chromium):
#   installed from Debian's packages when it is missing and this runs as root with apt-get;
# - a PostgreSQL server for the PostgreSQL tests ($EVALD_TEST_POSTGRES_URL, default the local one on
#   127.0.0.1:5432), and the server binaries (initdb, pg_ctl) for the outage tests' private clusters:
#   a local cluster that is installed but stopped is started (as root);
# - bubblewrap (bwrap), the sandbox code tasks run the model's programs in: installed from Debian's
#   packages when it is missing and this runs as root with apt-get.
#
# Anything it cannot provide stops `make test` here with the one command to run, before the suite starts:
# the suite then runs with EVALD_REQUIRE_BROWSER=1 and EVALD_REQUIRE_POSTGRES=1 and fails instead of
# skipping those tests, so a green `make test` has tested the dashboard and PostgreSQL.
#
# EVALD_APT_GET names the apt-get to run (its own tests give a recording stand-in; nothing else should).
set -euo pipefail

DEBIAN_CHROMIUM=/usr/bin/chromium
chromium="${EVALD_CHROMIUM:-$DEBIAN_CHROMIUM}"
apt_get="${EVALD_APT_GET:-apt-get}"
postgres_url="${EVALD_TEST_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"

missing() {
  echo "make test: $1" >&2
  echo "make test: run this, then make test again:" >&2
  echo "    $2" >&2
  exit 1
}

can_install() {
  [ "$(id -u)" = 0 ] && command -v "$apt_get" >/dev/null 2>&1
}

# --- Chromium -------------------------------------------------------------------------------------------
if [ ! -x "$chromium" ]; then
  if can_install; then
    echo "make test: no Chromium at $chromium; installing Debian's chromium for the dashboard's browser tests"
    if ! { "$apt_get" update -qq && DEBIAN_FRONTEND=noninteractive "$apt_get" install -y -qq chromium; }; then
      echo "make test: installing chromium failed (above)" >&2
    fi
  fi
  if [ ! -x "$chromium" ]; then
    if [ "$chromium" != "$DEBIAN_CHROMIUM" ] && [ -x "$DEBIAN_CHROMIUM" ]; then
      # A path of the user's own, which Debian's package does not fill.
      missing "no Chromium at EVALD_CHROMIUM=$chromium (the dashboard's browser tests need one)" \
        "unset EVALD_CHROMIUM  # Debian's is at $DEBIAN_CHROMIUM"
    fi
    missing "no Chromium at $chromium (the dashboard's browser tests need one)" \
      "sudo apt-get update && sudo apt-get install -y chromium"
  fi
fi

# --- bubblewrap -----------------------------------------------------------------------------------------
if ! command -v bwrap >/dev/null 2>&1; then
  if can_install; then
    echo "make test: no bwrap; installing Debian's bubblewrap for the code tasks' sandbox"
    if ! { "$apt_get" update -qq && DEBIAN_FRONTEND=noninteractive "$apt_get" install -y -qq bubblewrap; }; then
      echo "make test: installing bubblewrap failed (above)" >&2
    fi
  fi
  command -v bwrap >/dev/null 2>&1 \
    || missing "no bwrap (the code tasks' sandbox tests need bubblewrap)" "sudo apt-get install -y bubblewrap"
fi

# --- PostgreSQL -----------------------------------------------------------------------------------------
server_bin=$(find /usr/lib/postgresql -path '*/bin/initdb' 2>/dev/null | sort -V | tail -n 1)
if [ -z "$server_bin" ] && ! command -v initdb >/dev/null 2>&1; then
  missing "no PostgreSQL server binaries (initdb, pg_ctl): the PostgreSQL and outage tests need them" \
    "sudo apt-get install -y postgresql"
fi

answering() {
  if command -v pg_isready >/dev/null 2>&1; then
    pg_isready -q -d "${postgres_url/+psycopg/}"
  else
    return 1
  fi
}

if ! answering && [ -z "${EVALD_TEST_POSTGRES_URL:-}" ] && [ "$(id -u)" = 0 ] \
  && command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  version=$(ls /etc/postgresql | sort -V | tail -n 1)
  if [ -n "$version" ]; then
    echo "make test: PostgreSQL is not answering at $postgres_url; starting the local cluster $version/main"
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 30); do answering && break; sleep 1; done
  fi
fi
if ! answering; then
  if [ -n "${EVALD_TEST_POSTGRES_URL:-}" ]; then
    missing "PostgreSQL is not answering at EVALD_TEST_POSTGRES_URL=$postgres_url" \
      "unset EVALD_TEST_POSTGRES_URL  # for the local server; or start the one it names"
  fi
  version=$(ls /etc/postgresql 2>/dev/null | sort -V | tail -n 1)
  missing "PostgreSQL is not answering at $postgres_url (the PostgreSQL tests need it; user postgres, trusted on loopback)" \
    "sudo pg_ctlcluster ${version:-VERSION} main start"
fi
