#!/usr/bin/env bash
# Make a Debian base image on this host from Debian's packages alone, for hosts that reach a
# Debian mirror but no image registry: the local stand-in for debian:<suite>-slim that
# `docker/build.sh cpu --base` takes.
#
#   docker/debian-base.sh [SUITE]    build (or reuse) it; the last stdout line is its tag
#
# Needs root, mmdebstrap and podman (or a docker daemon). SUITE defaults to the host's release.
# The image is minbase (what the -slim images are: no docs, man pages or locales) plus
# ca-certificates and the host's extra CA certificates, so pip inside a build trusts a site's
# TLS-inspecting proxy. Tag and cached rootfs are keyed on the hash of what goes into them (the
# mmdebstrap options, the suite, the host's apt sources and extra CAs): a rerun with the same
# inputs reuses the image, or imports the tarball cached under
# ${CHARLLM_CACHE:-~/.cache/charllm-kit}/containers (which keeps only the newest per suite).
# Delete that tarball and the image to take newer Debian packages.
set -euo pipefail
source "$(dirname "$(realpath "$0")")/engine.sh"

suite=${1:-$(. /etc/os-release && echo "$VERSION_CODENAME")}
sources=/etc/apt/sources.list.d/debian.sources
[[ -f $sources ]] || sources=/etc/apt/sources.list
shopt -s nullglob
cas=(/usr/local/share/ca-certificates/*.crt)
options=(
  --quiet --variant=minbase --include=ca-certificates
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --customize-hook='cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/" 2>/dev/null || true'
  --customize-hook='chroot "$1" update-ca-certificates'
  --customize-hook='rm -rf "$1"/var/lib/apt/lists/*'
)
key=$( (printf '%s\n' "${options[@]}" "$suite" && cat "$sources" "${cas[@]}") | sha256sum | cut -c1-12)
tag="localhost/charllm-kit-debian:$suite-$key"
engine=$(oci_engine)

if "$engine" image inspect "$tag" >/dev/null 2>&1; then
  echo "$tag"
  exit 0
fi
cache="${CHARLLM_CACHE:-$HOME/.cache/charllm-kit}/containers"
rootfs="$cache/debian-$suite-$key.tar"
if [[ ! -f $rootfs ]]; then
  command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap not found: apt-get install mmdebstrap" >&2; exit 2; }
  mkdir -p "$cache"
  partial="$cache/debian-$suite-$key.partial.tar"  # mmdebstrap picks the format by the extension
  mmdebstrap "${options[@]}" "$suite" "$partial" "$sources" </dev/null >&2
  mv "$partial" "$rootfs"
  for old in "$cache/debian-$suite-"*.tar; do
    [[ $old == "$rootfs" ]] || rm -f "$old"
  done
fi
"$engine" import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$rootfs" "$tag" >/dev/null
echo "$tag"
