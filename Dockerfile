# syntax=docker/dockerfile:1
#
# Agent-Reach image: one image for every process (api, worker, beat, flower,
# migrations); docker-compose.yml picks the process with `command:`. For a trial, the
# whole hub (API, worker, beat and the demo agents, on the embedded store and broker,
# its state in the volume) in one container:
#
#   docker run -p 8800:8800 -v reach:/var/lib/reach agent-reach up

# ---- build: install the hub (`.[hub]`) into a self-contained venv ----------
FROM python:3.11-slim AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

RUN python -m venv /opt/venv

WORKDIR /src
COPY . .
RUN pip install '.[hub]'

# ---- runtime: the venv only, no sources, no build tools, non-root ---------
FROM python:3.11-slim

# REACH_HOME: the embedded store, broker, keys and logs (reach up's state) live in the
# volume; REACH_SERVER__HOST: the API (also the one `reach up` starts) listens beyond the
# container's loopback, so `-p 8800:8800` reaches it, and API keys are required there.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/reach \
    REACH_HOME=/var/lib/reach \
    REACH_SERVER__HOST=0.0.0.0

RUN groupadd --system --gid 10001 reach \
 && useradd --system --uid 10001 --gid reach \
        --home-dir /var/lib/reach --create-home --shell /usr/sbin/nologin reach

COPY --from=build /opt/venv /opt/venv
# The demo agents `reach up` starts (reach.cli.supervisor.find_examples_dir looks here).
COPY examples/agents/ /opt/venv/share/agent-reach/examples/agents/
COPY --chmod=0755 scripts/docker-entrypoint /usr/local/bin/reach-entrypoint

# Writable working directory for the non-root user, and the hub's state: the embedded
# SQLite store and broker (when REACH_DATABASE_URL is unset), keys, certs and logs. A
# volume, so a container started again on it finds its tasks (created above, owned by
# reach: a new named volume starts with that owner).
WORKDIR /var/lib/reach
VOLUME /var/lib/reach
USER reach:reach

# 8800 API, 8801 admin, 5555 Flower.
EXPOSE 8800 8801 5555

# `docker run agent-reach up` (or any reach command) runs `reach up`; other commands
# (docker-compose.yml's `reach api …`, `sh -c …`) run as given (scripts/docker-entrypoint).
ENTRYPOINT ["reach-entrypoint"]
CMD ["reach", "api", "--port", "8800"]
