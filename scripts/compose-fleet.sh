#!/usr/bin/env bash
# A two-member fleet on Docker Compose, in three projects (docs/fleet.md, "Deploying a fleet"):
#   bash scripts/compose-fleet.sh up       the images, then the hub (tjpipe-fleet), then members c1 and c2
#                                          (tjpipe-c1, tjpipe-c2): each a whole lone-cluster stack, demo included
#   bash scripts/compose-fleet.sh logs c1 demo   a member's service's log, followed (any compose service)
#   bash scripts/compose-fleet.sh down     all three, volumes and the host folders' seeds kept (see below)
#   bash scripts/compose-fleet.sh purge    all three with their volumes, and the host folders
# Host ports, 127.0.0.1 only: the hub's NATS 4230; c1's API server 6444, NATS 4224, history server 8081,
# status server 10444; c2's 6445, 4225, 8082, 10445. Host folders: compose/fleet-state (the hub's reader),
# compose/state-c1 and compose/state-c2 (each member's, as compose/state is the lone stack's).
set -euo pipefail
cd "$(dirname "$0")/.."
if docker compose version >/dev/null 2>&1; then compose=(docker compose); else compose=(docker-compose); fi
hub=(-p tjpipe-fleet -f compose/fleet.yml --profile fleet)
member() {
  local cluster=$1 n=$2
  shift 2
  TJPIPE_FLEET_CLUSTER="$cluster" TJPIPE_COMPOSE_STATE="./state-$cluster" \
    TJPIPE_COMPOSE_KUBE_PORT=$((6443 + n)) TJPIPE_COMPOSE_NATS_PORT=$((4223 + n)) \
    TJPIPE_COMPOSE_HISTORY_PORT=$((8080 + n)) TJPIPE_COMPOSE_STATUS_PORT=$((10443 + n)) \
    "${compose[@]}" -p "tjpipe-$cluster" -f compose/docker-compose.yml -f compose/fleet-member.yml "$@"
}
case "${1:-}" in
  up)
    bash scripts/compose-images.sh
    "${compose[@]}" "${hub[@]}" up -d
    member c1 1 up -d
    member c2 2 up -d
    cat <<'SAY'
The fleet is up: the hub and two members, each running the demo (bash scripts/compose-fleet.sh logs c1 demo).
The hub's copy of a member's history, as fleet-reader:
  . compose/fleet-state/hub.env && tjpipe history --cluster c1 tjpipe-demo/mnist
  tjpipe fleet status          (each fleet stream's copy of each member: lag, last contact)
A member on its own, as a lone stack: . compose/state-c1/env && kubectl get trainjobs -A
SAY
    ;;
  logs)
    [ $# -ge 2 ] || { echo "usage: bash scripts/compose-fleet.sh logs c1|c2 [SERVICE]" >&2; exit 2; }
    case "$2" in c1) n=1 ;; c2) n=2 ;; *) echo "no member $2 (c1 or c2)" >&2; exit 2 ;; esac
    member "$2" "$n" logs -f "${@:3}"
    ;;
  down | purge)
    volumes=()
    if [ "$1" = purge ]; then volumes=(-v); fi
    member c2 2 down "${volumes[@]}" --remove-orphans
    member c1 1 down "${volumes[@]}" --remove-orphans
    "${compose[@]}" "${hub[@]}" down "${volumes[@]}" --remove-orphans
    if [ "$1" = purge ]; then rm -rf compose/fleet-state compose/state-c1 compose/state-c2; fi
    ;;
  *)
    echo "usage: bash scripts/compose-fleet.sh up|logs|down|purge" >&2
    exit 2
    ;;
esac
