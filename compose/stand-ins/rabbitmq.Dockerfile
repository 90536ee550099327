# Stand-in for rabbitmq:3.10.8-management: Debian 12's rabbitmq-server 3.10.8 (the one the
# tests run) with the management plugin, set up as the official image is: HOME and the Erlang
# cookie in /var/lib/rabbitmq for the server and for `rabbitmq-diagnostics` run as root by the
# healthcheck, logs on stdout, and a docker-entrypoint.sh that runs the server as rabbitmq.
# RabbitMQ itself (3.9.4+) reads RABBITMQ_DEFAULT_USER and RABBITMQ_DEFAULT_PASS.
FROM lbg-debian:bookworm
RUN apt-get update -qq \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends rabbitmq-server \
    && rm -rf /var/lib/apt/lists/* \
    && rabbitmq-plugins enable --offline rabbitmq_management \
    && ln -sf /var/lib/rabbitmq/.erlang.cookie /root/.erlang.cookie
ENV HOME=/var/lib/rabbitmq RABBITMQ_LOGS=- PATH=/usr/lib/rabbitmq/bin:$PATH
COPY rabbitmq-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
EXPOSE 5672 15672
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["rabbitmq-server"]
