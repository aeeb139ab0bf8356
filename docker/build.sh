#!/usr/bin/env bash
# Build a charllm-kit image with whichever engine this host has: docker, or buildah/podman.
#
#   docker/build.sh cpu|cuda|rocm [--base IMAGE] [--tag TAG] [--wheels DIR]
#
# The last stdout line is the tag it made (the engines' output goes to stderr).
#   --base IMAGE  replaces the flavour's base: for cpu the Debian image under the CPU torch
#                 (default debian:bookworm-slim); for cuda and rocm the PyTorch image.
#   --tag TAG     the image's name (default charllm-kit:<flavour>).
#   --wheels DIR  (buildah/podman) a folder holding the CPU torch wheel, bind-mounted while
#                 building so torch comes from it alone and stays out of the image's layers.
# Rebuilds reuse cached layers: the dependency layer until pyproject.toml or the base changes.
set -euo pipefail
cd "$(dirname "$0")/.."
source docker/engine.sh

usage() {
  echo "usage: docker/build.sh cpu|cuda|rocm [--base IMAGE] [--tag TAG] [--wheels DIR]" >&2
  exit 2
}

flavour=${1:-}
case "$flavour" in
  cpu) base=debian:bookworm-slim extras=deepspeed ;;
  cuda) base=nvcr.io/nvidia/pytorch:25.09-py3 extras=deepspeed ;;
  rocm) base=rocm/pytorch:latest extras=amd,deepspeed ;;
  *) usage ;;
esac
shift
tag=charllm-kit:$flavour
wheels=
while (($#)); do
  case "$1" in
    --base) base=${2:?--base needs an image}; shift 2 ;;
    --tag) tag=${2:?--tag needs a name}; shift 2 ;;
    --wheels)
      [[ -d ${2:-} ]] || { echo "error: --wheels ${2:-}: not a folder" >&2; exit 2; }
      wheels=$(realpath "$2"); shift 2 ;;
    *) usage ;;
  esac
done

engine=$(oci_engine)
if [[ $engine == docker && -n $wheels ]]; then
  echo "error: --wheels needs buildah or podman (docker build cannot bind-mount a folder)" >&2
  exit 2
fi
# Names of local images: podman and buildah store an unqualified name under localhost/.
local_name() { if [[ $engine == docker || $1 == */* ]]; then echo "$1"; else echo "localhost/$1"; fi; }

build() {  # build DOCKERFILE TAG NAME=VALUE... (build arguments)
  local file=$1 out=$2 args=()
  shift 2
  for a in "$@"; do args+=(--build-arg "$a"); done
  if [[ $engine == docker ]]; then
    docker build -f "$file" -t "$out" "${args[@]}" . >&2
  else
    # --network host: the build's pip and apt use the host's network as it is (no CNI setup).
    local cmd=(podman build)
    command -v buildah >/dev/null && cmd=(buildah bud)
    "${cmd[@]}" --layers --network host ${wheels:+-v "$wheels:/wheels:ro"} \
      -f "$file" -t "$out" "${args[@]}" . >&2
  fi
}

if [[ $flavour == cpu ]]; then
  torch_base=$(local_name charllm-kit-torch:cpu)
  args=("DEBIAN=$base")
  [[ -n $wheels ]] && args+=(PIP_EXTRA_INDEX_URL=)  # torch from the wheels folder alone
  build docker/Dockerfile.torch-cpu "$torch_base" "${args[@]}"
  base=$torch_base
fi

revision=$(git rev-parse HEAD 2>/dev/null || true)
[[ -n $revision && -n $(git status --porcelain 2>/dev/null) ]] && revision+=-dirty
source_url=$(git remote get-url origin 2>/dev/null || true)
[[ $source_url == *://* ]] || source_url=  # a local path says nothing to whoever pulls the image
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)
tag=$(local_name "$tag")
build docker/Dockerfile "$tag" "BASE=$base" "EXTRAS=$extras" "FLAVOUR=$flavour" \
  "VERSION=$version" "REVISION=$revision" "SOURCE=$source_url"
echo "$tag"
