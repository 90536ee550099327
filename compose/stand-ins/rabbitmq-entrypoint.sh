#!/bin/sh
# The stand-in's docker-entrypoint.sh: run the command (rabbitmq-server) as user rabbitmq,
# keeping the environment (RABBITMQ_DEFAULT_USER / RABBITMQ_DEFAULT_PASS), as the official
# image's entrypoint does.
set -e
if [ "$(id -u)" = 0 ]; then
    exec setpriv --reuid=rabbitmq --regid=rabbitmq --init-groups "$@"
fi
exec "$@"
