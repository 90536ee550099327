#!/usr/bin/env bash
# make test-compose: compose/compose.yaml for real, profile nats, on a Docker daemon of its own.
# No registry is reachable here, so the images the compose file names are local stand-ins
# built from Debian packages and tagged with those names (see README.md in this folder); the
# project image is built from the repository's unchanged Dockerfile.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
STATE="${XDG_CACHE_HOME:-$HOME/.cache}/lbg-compose"
BASE=lbg-debian:bookworm
DOCKER=/usr/bin/docker
export DOCKER_HOST="unix://$STATE/docker.sock" COMPOSE_PROFILES=nats
export COMPOSE_PROJECT_NAME=lbg-test-compose
started=$(date +%s)
say() { echo "[$(( $(date +%s) - started ))s] $*"; }

need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
command -v debootstrap >/dev/null || need+=(debootstrap)
if ((${#need[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
mkdir -p "$STATE"

# A daemon of our own, stopped by its PID whatever happens.
dockerd --data-root "$STATE/docker" --exec-root "$STATE/exec" -H "$DOCKER_HOST" \
    --pidfile "$STATE/dockerd.pid" >"$STATE/dockerd.log" 2>&1 &
DOCKERD=$!
cleanup() {
    [ -n "${COMPOSE_FILE:-}" ] && docker-compose down -v --remove-orphans >/dev/null 2>&1 || true
    kill "$DOCKERD" 2>/dev/null && wait "$DOCKERD" 2>/dev/null || true
}
trap cleanup EXIT
for _ in $(seq 60); do $DOCKER info >/dev/null 2>&1 && break; sleep 0.5; done
$DOCKER info >/dev/null
say "dockerd $DOCKERD up"

# Base image: Debian 12 from debootstrap, cached between runs.
if ! $DOCKER image inspect "$BASE" >/dev/null 2>&1; then
    if [ ! -x "$STATE/rootfs/usr/bin/apt-get" ]; then
        rm -rf "$STATE/rootfs"
        debootstrap --variant=minbase bookworm "$STATE/rootfs" >"$STATE/debootstrap.log"
    fi
    tar -C "$STATE/rootfs" -c . | $DOCKER import - "$BASE" >/dev/null
fi
say "base image $BASE"

# Stand-ins, tagged as compose.yaml and the Dockerfile name them.
image_of() { sed -n "s/^ *image: *\($1[^ ]*\)$/\1/p" "$REPO/compose/compose.yaml" | head -1; }
python_image=$(sed -n 's/^FROM \(python:[^ ]*\).*/\1/p' "$REPO/Dockerfile" | head -1)
nats_image=$(image_of nats:)
context="$STATE/nats-context"
mkdir -p "$context"
cp "$REPO/compose/stand-ins/nats.Dockerfile" "$context/Dockerfile"
cp "$("$REPO/.venv/bin/python" -c 'import shutil; print(shutil.which("nats-server"))')" "$context/"
python_context="$STATE/python-context"
mkdir -p "$python_context"
cp "$REPO/compose/stand-ins/python.Dockerfile" "$python_context/Dockerfile"
cp /etc/ssl/certs/ca-certificates.crt "$python_context/"
$DOCKER build -q -t "$python_image" "$python_context" >/dev/null
$DOCKER build -q -t "$nats_image" "$context" >/dev/null
say "stand-ins $python_image and $nats_image"

cd "$REPO/compose"
"$REPO/.venv/bin/python" "$REPO/compose/stand-ins/compose_v1.py" compose.yaml "$STATE/compose.v1.yaml" nats
export COMPOSE_FILE="$STATE/compose.v1.yaml"
docker-compose() { command docker-compose --project-directory "$REPO/compose" "$@"; }
umask 022
for secret in broker_password client_password; do
    [ -s "secrets/$secret" ] || python3 -c 'import secrets; print(secrets.token_hex(24))' >"secrets/$secret"
done
docker-compose build -q
say "project image built from ../Dockerfile ($($DOCKER image inspect -f '{{.Size}}' sticky-lbg:latest) bytes)"

docker-compose up -d
healthy() { [ "$($DOCKER inspect -f '{{.State.Health.Status}}' "$1" 2>/dev/null)" = healthy ]; }
wait_healthy() {
    for _ in $(seq 120); do
        local ok=1
        for c in $(docker-compose ps -q "$@"); do healthy "$c" || ok=0; done
        [ "$ok" = 1 ] && [ -n "$(docker-compose ps -q "$@")" ] && return 0
        sleep 1
    done
    docker-compose ps; docker-compose logs --tail 20; return 1
}
wait_healthy nats hashed-publisher validation-client lbg-client
say "broker healthy, cg-admin done, publisher, validator and a client ready"

docker-compose up -d --scale lbg-client=4 --no-recreate
wait_healthy lbg-client
say "4 clients ready"
sleep 5
clients=($(docker-compose ps -q lbg-client))
$DOCKER kill "${clients[0]}" >/dev/null
say "docker kill one client"
sleep 5
$DOCKER stop -t 60 "${clients[1]}" >/dev/null
say "docker stop another (SIGTERM handover)"
sleep 5

docker-compose stop -t 30 hashed-publisher
say "publisher stopped (its summary sent)"
sleep 15
docker-compose stop -t 30 validation-client
report=$(docker-compose logs --no-color validation-client | sed 's/^[^|]*| //')
echo "$report" | grep -v '^{' | tail -20
lost=$(echo "$report" | sed -n 's/^lost *\([0-9-]*\).*/\1/p' | tail -1)
reordered=$(echo "$report" | sed -n 's/^reordered *\([0-9-]*\).*/\1/p' | tail -1)
say "lost=${lost:-?} reordered=${reordered:-?}"
if [ "$lost" != 0 ] || [ "$reordered" != 0 ]; then
    docker-compose logs --no-color lbg-client validation-client | grep -v "pull failed" | head -60
    docker-compose logs --no-color --tail 15 lbg-client validation-client hashed-publisher
    say "test-compose FAILED"
    exit 1
fi
say "test-compose passed"
