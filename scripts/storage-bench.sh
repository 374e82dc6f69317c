#!/usr/bin/env bash
# The nested Docker's storage driver, measured: in each given lab node container, load the engine base
# image, build a one-step image on it, run two containers of it and save it; print the seconds of each
# step per node and, with two nodes, the second's time over the first's. Used to choose overlay2 over
# vfs for the lab's nodes (README, "the lab"); make two one-node labs whose nodes differ in
# /etc/docker/daemon.json's storage-driver and give both:
#   scripts/storage-bench.sh sparkfleet-lab-A-spark1 sparkfleet-lab-B-spark1
# Leaves images t1 and the engine base in the nodes' Docker (a lab's `down` removes them with the node).
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 NODE-CONTAINER [NODE-CONTAINER]" >&2; exit 2; }
base=$(docker images --format '{{.Repository}}:{{.Tag}}' sparkfleet-lab/engine-base | head -n 1)
[ -n "$base" ] || { echo "no sparkfleet-lab/engine-base image here: run sparkfleet lab images" >&2; exit 2; }

secs() {  # seconds the command takes
  local s e
  s=$(date +%s.%N)
  "$@" > /dev/null 2>&1
  e=$(date +%s.%N)
  python3 -c "print(f'{$e - $s:.2f}')"
}

declare -A t
steps=(load build run1 run2 save)
for n in "$@"; do
  driver=$(docker exec "$n" docker info --format '{{.Driver}}')
  t[$n,load]=$(secs sh -c "docker save $base | docker exec -i $n docker load -q")
  printf 'FROM %s\nRUN python3 -m pip --version > /dev/null && echo hi > /opt/x\nLABEL a=b\n' "$base" \
    | docker exec -i "$n" sh -c 'mkdir -p /tmp/storage-bench && cat > /tmp/storage-bench/Dockerfile'
  t[$n,build]=$(secs docker exec "$n" sh -c 'cd /tmp/storage-bench && docker build -q --network host -t t1 .')
  t[$n,run1]=$(secs docker exec "$n" docker run --rm --network host t1 true)
  t[$n,run2]=$(secs docker exec "$n" docker run --rm --network host t1 true)
  t[$n,save]=$(secs docker exec "$n" sh -c 'docker save t1 > /dev/null')
  line="$n ($driver):"
  for s in "${steps[@]}"; do line+=" $s ${t[$n,$s]} s"; done
  echo "$line"
done
if [ $# -ge 2 ]; then
  line="$2 / $1:"
  for s in "${steps[@]}"; do line+=" $s $(python3 -c "print(f'{${t[$2,$s]} / max(${t[$1,$s]}, 0.01):.2f}')")"; done
  echo "$line"
fi
