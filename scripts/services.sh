#!/usr/bin/env bash
# Start the local services the test suite uses (PostgreSQL, Redis, RabbitMQ) if they are not running.
set -u

if ! pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
  echo "starting PostgreSQL"
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
fi
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  echo "starting Redis"
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
fi
if ! (echo > /dev/tcp/127.0.0.1/5672) 2>/dev/null; then
  echo "starting RabbitMQ"
  rabbitmq-server -detached
fi

for _ in $(seq 1 60); do
  pg_isready -q -h 127.0.0.1 -p 5432 && redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 \
    && (echo > /dev/tcp/127.0.0.1/5672) 2>/dev/null && exit 0
  sleep 1
done
echo "services did not come up: PostgreSQL 127.0.0.1:5432, Redis 127.0.0.1:6379, RabbitMQ 127.0.0.1:5672" >&2
exit 1
