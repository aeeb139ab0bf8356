# Sourced by build.sh and debian-base.sh: which OCI engine this host has.
#
# docker when its daemon answers (a docker client alone, as some hosts have, cannot build);
# otherwise podman and buildah, which need no daemon. Prints docker or podman; exit 2 if none.
oci_engine() {
  if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
    echo docker
  elif command -v podman >/dev/null; then
    echo podman
  else
    echo "error: no OCI engine: install docker (with its daemon running), or podman and buildah" >&2
    return 2
  fi
}
