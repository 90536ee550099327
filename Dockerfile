# syntax=docker/dockerfile:1
# One image for every daemon: the command picks it (cg-admin, hashed-publisher, lbg-client,
# validation-client or lbg). Configuration is read from /etc/lbg, mounted from config/ (see
# compose/compose.yaml); passwords come from the environment (LBG_BROKER_PASSWORD,
# LBG_ADMIN_PASSWORD, LBG_CLIENT_PASSWORD) or from secret files that the TOML's
# password_file keys name. Neither is ever copied into the image.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The daemons only (no [replay] or [loadtest] extra), at the versions the tests passed with.
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY services ./services
RUN python -m venv /opt/lbg && /opt/lbg/bin/pip install -c constraints.txt .

FROM python:3.11-slim
RUN groupadd --system --gid 10001 lbg \
    && useradd --system --uid 10001 --gid lbg --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin lbg \
    && install -d -m 0755 /etc/lbg
COPY --from=build /opt/lbg /opt/lbg
ENV PATH=/opt/lbg/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 10001:10001
# The daemons hand their queues over on SIGTERM; give them time (docker stop -t / stop_grace_period).
STOPSIGNAL SIGTERM
# No HTTP endpoint is assumed here (metrics are off unless configured): the daemon must be PID 1
# (exec form, no --init) and neither stopped (SIGSTOP, a stalled client) nor a zombie.
# compose/compose.yaml probes /readyz instead (`lbg probe 9464`) for the daemons that serve it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys; stat = open('/proc/1/stat').read(); sys.exit(stat.rpartition(')')[2].split()[0] in 'TtZX')"]
CMD ["lbg", "--help"]
