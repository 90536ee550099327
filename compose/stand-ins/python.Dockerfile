# Stand-in for python:3.11-slim where no registry is reachable: Debian 12's python3 is 3.11.
# The host's CA bundle (copied into this context by test-compose.sh) lets pip in the project's
# build reach the package index through this machine's TLS-inspecting network path.
FROM lbg-debian:bookworm
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        python3 python3-venv python-is-python3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt
