#!/usr/bin/env bash
# A local AWS emulator for the AWS-path tests: moto's server mode (PyPI `moto[server]`, pinned),
# installed in a virtual environment under $EPHEM_HOME (default ./.ephem) and run on 127.0.0.1.
#
#   scripts/moto.sh install    create the venv and install moto (idempotent)
#   scripts/moto.sh start      install if needed, start a server on a free port, print its endpoint
#   scripts/moto.sh endpoint   print the running server's endpoint
#   scripts/moto.sh stop       stop the server this script started
#
# The server's pid, port and log live in $EPHEM_HOME/moto/. What moto does and does not emulate
# is in docs/operations.md ("Against an emulator").
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib/venv.sh
home="${EPHEM_HOME:-$PWD/.ephem}"
venv="$home/venv-moto"
state="$home/moto"
moto_version="5.2.5"

install() {
    if [ -x "$venv/bin/moto_server" ] && "$venv/bin/python" -c "import moto, sys; sys.exit(moto.__version__ != '$moto_version')" 2>/dev/null; then
        return
    fi
    make_venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "moto[server]==$moto_version"
}

running_pid() {
    local pid
    pid="$(cat "$state/pid" 2>/dev/null)" || return 1
    # Only the server this script started: the pid must still be a moto_server.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q moto_server || return 1
    echo "$pid"
}

endpoint() {
    running_pid >/dev/null || { echo "moto is not running (scripts/moto.sh start)" >&2; return 1; }
    echo "http://127.0.0.1:$(cat "$state/port")"
}

start() {
    if running_pid >/dev/null; then
        endpoint
        return
    fi
    install
    mkdir -p "$state"
    local port
    port="$("$venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    # setsid: its own session, so a Ctrl-C in the calling terminal does not reach it.
    setsid "$venv/bin/moto_server" -H 127.0.0.1 -p "$port" >"$state/server.log" 2>&1 </dev/null &
    echo $! >"$state/pid"
    echo "$port" >"$state/port"
    for _ in $(seq 1 100); do
        if "$venv/bin/python" -c "import urllib.request, sys; urllib.request.urlopen('http://127.0.0.1:$port/moto-api/data.json', timeout=1)" 2>/dev/null; then
            echo "http://127.0.0.1:$port"
            return
        fi
        running_pid >/dev/null || break
        sleep 0.2
    done
    echo "moto did not start; see $state/server.log" >&2
    tail -n 20 "$state/server.log" >&2 || true
    return 1
}

stop() {
    local pid
    if pid="$(running_pid)"; then
        kill "$pid"
        for _ in $(seq 1 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$state/pid" "$state/port"
}

case "${1:-}" in
    install) install ;;
    start) start ;;
    endpoint) endpoint ;;
    stop) stop ;;
    *) echo "usage: scripts/moto.sh install|start|endpoint|stop" >&2; exit 2 ;;
esac
