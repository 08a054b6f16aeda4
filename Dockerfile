# syntax=docker/dockerfile:1
#
# Agent-Reach image: one image for every process (api, worker, beat, flower,
# migrations); docker-compose.yml picks the process with `command:`.

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

ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/var/lib/reach

RUN groupadd --system --gid 10001 reach \
 && useradd --system --uid 10001 --gid reach \
        --home-dir /var/lib/reach --create-home --shell /usr/sbin/nologin reach

COPY --from=build /opt/venv /opt/venv

# Writable working directory for the non-root user: embedded SQLite file
# (when REACH_DATABASE_URL is unset) and Celery beat's local schedule state.
WORKDIR /var/lib/reach
USER reach:reach

# 8800 API, 8801 admin, 5555 Flower.
EXPOSE 8800 8801 5555

CMD ["reach", "api", "--host", "0.0.0.0", "--port", "8800"]
