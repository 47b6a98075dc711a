#!/bin/sh
# Writes this pod's redis.conf and sentinel.conf into /conf (an emptyDir: Sentinel rewrites its own file).
# The master is whoever the sentinels name now (after a failover, not pod 0); on the very first start, when
# no sentinel answers, pod 0 is the master and the others replicate it.
set -eu
REDIS_PASSWORD=$(cat /run/secrets/redis/password)  # the Secret prewarm's redis-password, mounted as a file
svc="prewarm-redis-headless.${POD_NAMESPACE}.svc.cluster.local"
me="${HOSTNAME}.${svc}"
master=""
for i in 0 1 2; do
  peer="prewarm-redis-${i}.${svc}"
  [ "${peer}" = "${me}" ] && continue
  master=$(timeout 3 redis-cli -h "${peer}" -p 26379 sentinel get-master-addr-by-name prewarm 2>/dev/null | head -n 1 || true)
  [ -n "${master}" ] && break
done
[ -n "${master}" ] || master="prewarm-redis-0.${svc}"
echo "init: this pod is ${me}; master ${master}"
{
  echo "port 6379"
  echo "dir /data"
  echo "appendonly yes"
  echo "appendfsync everysec"
  echo "maxmemory-policy noeviction"
  echo "replica-announce-ip ${me}"
  echo "requirepass ${REDIS_PASSWORD}"
  echo "masterauth ${REDIS_PASSWORD}"
  # a master that has lost every replica stops taking writes after 10 s, so an isolated old master cannot
  # accept what a failover would then throw away (docs/deploy.md)
  echo "min-replicas-to-write 1"
  echo "min-replicas-max-lag 10"
  [ "${master}" = "${me}" ] || echo "replicaof ${master} 6379"
} > /conf/redis.conf
{
  echo "port 26379"
  echo "dir /tmp"
  echo "sentinel resolve-hostnames yes"
  echo "sentinel announce-hostnames yes"
  echo "sentinel announce-ip ${me}"
  echo "sentinel monitor prewarm ${master} 6379 2"
  echo "sentinel auth-pass prewarm ${REDIS_PASSWORD}"
  echo "sentinel down-after-milliseconds prewarm 5000"
  echo "sentinel failover-timeout prewarm 60000"
  echo "sentinel parallel-syncs prewarm 1"
} > /conf/sentinel.conf
chmod 600 /conf/redis.conf /conf/sentinel.conf
