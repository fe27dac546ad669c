#!/usr/bin/env bash
# Builds delayq's container images on a machine that cannot pull from an image
# registry: the base images are made from Debian's own packages (debootstrap), and
# the delayq image takes a binary built on the host. The end-to-end test runs this;
# so can you (as root, or with sudo for debootstrap):
#
#   cargo build --release
#   docker/local-images.sh target/release/delayq     # engine, bases, delayq:local
#
# Steps, each skipped when already done:
#   1. a Docker engine: if `docker info` fails, start dockerd (vfs storage, so it
#      runs anywhere, including inside another container), log in $DOCKERD_LOG;
#   2. the bases, made once and kept (docker image inspect tells):
#        delayq-local/debian:bookworm  minbase + ca-certificates (BASE_IMAGE)
#        delayq-local/servers:bookworm minbase + redis-server, etcd (REDIS_IMAGE,
#                                      ETCD_IMAGE in docker/compose.yaml)
#   3. with a binary argument: the image `${DELAYQ_IMAGE:-delayq:local}`, from the
#      Dockerfile's `prebuilt` target, in a build context of that binary and the
#      default configuration alone.
#
# Environment: DEBIAN_MIRROR (default: the Debian archive this machine's own apt
# sources name), DOCKERD_LOG (default /var/log/delayq-dockerd.log), DELAYQ_IMAGE.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)

# The archive this machine installs its own packages from: the first URI of a
# Debian source (deb822 .sources files, or one-line sources.list entries) that
# carries the main suites rather than security updates.
machine_mirror() {
  local f
  for f in /etc/apt/sources.list.d/*.sources; do
    [ -e "$f" ] || continue
    awk 'BEGIN { RS = ""; FS = "\n" }
      /(^|\n)Types:[^\n]*deb([ \t\n]|$)/ && !/security/ {
        for (i = 1; i <= NF; i++) if ($i ~ /^URIs:/) { split($i, u, /[ \t]+/); print u[2]; exit }
      }' "$f"
  done
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [ -e "$f" ] || continue
    awk '$1 == "deb" && $0 !~ /security/ { for (i = 2; i <= NF; i++) if ($i !~ /^\[/) { print $i; exit } }' "$f"
  done
}
mirror=${DEBIAN_MIRROR:-$(machine_mirror | head -n 1)}
if [ -z "$mirror" ]; then
  echo "local-images: no Debian archive in this machine's apt sources; set DEBIAN_MIRROR" >&2
  exit 1
fi
dockerd_log=${DOCKERD_LOG:-/var/log/delayq-dockerd.log}
base=delayq-local/debian:bookworm
servers=delayq-local/servers:bookworm
sudo=""
[ "$(id -u)" = 0 ] || sudo=sudo

say() { echo "local-images: $*" >&2; }

engine() {
  docker info >/dev/null 2>&1 && return 0
  command -v dockerd >/dev/null || { say "no dockerd: apt-get install docker.io"; return 1; }
  say "starting dockerd (log: $dockerd_log)"
  # Its own session, so it outlives this script and whatever ran it.
  # Without fd 9: the daemon must not keep this script's lock.
  $sudo sh -c 'setsid dockerd --storage-driver=vfs >>"$1" 2>&1 </dev/null 9>&- &' sh "$dockerd_log"
  for _ in $(seq 120); do
    docker info >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  say "dockerd did not answer within 60s; the end of its log:"
  tail -n 20 "$dockerd_log" >&2 || true
  return 1
}

# bootstrap NAME PACKAGES: a minimal bookworm with PACKAGES, imported as NAME.
bootstrap() {
  local name=$1 include=$2 dir
  docker image inspect "$name" >/dev/null 2>&1 && return 0
  command -v debootstrap >/dev/null || { say "no debootstrap: apt-get install debootstrap"; return 1; }
  say "making $name from Debian packages ($include)"
  dir=$(mktemp -d /var/tmp/delayq-rootfs.XXXXXX)
  chmod 0755 "$dir"   # the root of the image
  # shellcheck disable=SC2064
  trap "$sudo rm -rf '$dir'" RETURN
  $sudo debootstrap --variant=minbase --include="$include" bookworm "$dir" "$mirror" >&2 \
    || { say "debootstrap failed"; return 1; }
  # What debian:bookworm-slim leaves out too: package lists, caches, docs, man pages.
  $sudo rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin \
    "$dir"/var/cache/apt/archives/*.deb "$dir"/usr/share/doc/* "$dir"/usr/share/man/* \
    "$dir"/usr/share/info/* "$dir"/var/log/*.log
  $sudo find "$dir"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias \
    -exec rm -rf {} +
  $sudo tar -C "$dir" -c . | docker import \
    --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$name" >/dev/null
}

image() {
  local binary=$1 name=${DELAYQ_IMAGE:-delayq:local} ctx old
  [ -x "$binary" ] || { say "$binary: not an executable"; return 1; }
  ctx=$(mktemp -d)
  # shellcheck disable=SC2064
  trap "rm -rf '$ctx'" RETURN
  mkdir -p "$ctx/config" "$ctx/docker/bin"
  strip -o "$ctx/docker/bin/delayq" "$binary"
  cp "$repo/config/delayq.toml" "$ctx/config/"
  say "building $name from $binary"
  old=$(docker image inspect -f '{{.Id}}' "$name" 2>/dev/null || true)
  docker build -q -f "$repo/docker/Dockerfile" --target prebuilt \
    --build-arg BASE_IMAGE="$base" -t "$name" "$ctx" >/dev/null
  # The image it replaces, unless a container still uses it.
  if [ -n "$old" ] && [ "$old" != "$(docker image inspect -f '{{.Id}}' "$name")" ]; then
    docker image rm "$old" >/dev/null 2>&1 || true
  fi
  docker run --rm "$name" --version >/dev/null || { say "$name does not run delayq"; return 1; }
}

# One run at a time: a second waits for the first's engine and bases.
exec 9>/tmp/delayq-local-images.lock
flock -w 900 9 || { say "another run has held /tmp/delayq-local-images.lock for 15 minutes"; exit 1; }
engine
bootstrap "$base" ca-certificates
bootstrap "$servers" ca-certificates,redis-server,etcd-server,etcd-client
if [ $# -gt 0 ]; then
  image "$1"
fi
