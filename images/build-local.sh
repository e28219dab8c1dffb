#!/usr/bin/env bash
# Build the CPU, MLflow and GPU images on this machine without Docker or a registry, then run
# each as uid 10001 on a read-only root (images/smoke.sh). `make images-local`; not part of `make test` (minutes,
# and pip inside the builds needs PyPI).
#
# Needs buildah and debootstrap (Debian: apt-get install buildah debootstrap) and root or
# rootless buildah. The base is Debian bookworm made by debootstrap (python3 and its venv
# module) and committed as localhost/foxhunt-base:bookworm; builds run their steps with
# `--isolation chroot`. torch's CPU build comes from a wheel in TORCH_WHEELS (PyTorch's CPU
# index may be out of reach), the GPU image's CUDA torch from PyPI.
#
#   KINDS="cpu mlflow gpu"       which images
#   TORCH_WHEELS=/opt/wheels     a folder with torch-2.13.0+cpu-cp311-*.whl
#   OUT=build/images             the debootstrap root and the logs
#   CA_BUNDLE=...                certificates pip inside the builds must trust (a TLS-inspecting
#                                proxy's); default $PIP_CERT, else none. Mounted for the build
#                                steps only, never part of an image.
set -euo pipefail
cd "$(dirname "$0")/.."
KINDS=${KINDS:-"cpu mlflow gpu"}
TORCH_WHEELS=${TORCH_WHEELS:-/opt/wheels}
OUT=${OUT:-build/images}
BASE=localhost/foxhunt-base:bookworm
TAG=local
export BUILDAH_ISOLATION=chroot
for tool in buildah debootstrap; do
    command -v "$tool" >/dev/null || { echo "$tool not found: apt-get install buildah debootstrap" >&2; exit 1; }
done
mkdir -p "$OUT"
declare -A build_s smoke_s
mounts=()
CA_BUNDLE=${CA_BUNDLE:-${PIP_CERT:-}}
if [ -n "$CA_BUNDLE" ]; then
    printf '[global]\ncert = /etc/foxhunt-build-ca.crt\n' >"$OUT/pip.conf"
    mounts=(-v "$(realpath "$CA_BUNDLE"):/etc/foxhunt-build-ca.crt:ro"
            -v "$PWD/$OUT/pip.conf:/etc/pip.conf:ro")
fi
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# The smoke run as uid 10001 with the image's environment and working directory. As root: in
# a chroot of the image's root filesystem mounted read-only (a tmpfs on /tmp, as a pod with
# readOnlyRootFilesystem and an emptyDir would have), so a step that writes outside /tmp fails
# here. Otherwise: buildah run (writable root).
buildah_run() {
    buildah run --user 10001 -v "$PWD/images/smoke.sh:/smoke.sh:ro" "$1" -- sh /smoke.sh "$2"
}
read_only_root() {
    local c=$1 kind=$2 root env dir rc
    root=$(mktemp -d)
    mount --bind "$(buildah mount "$c")" "$root"
    mount -o remount,bind,ro "$root"
    mount -t tmpfs -o size=4g,mode=1777 tmpfs "$root/tmp"
    mount -t proc proc "$root/proc"
    mount --rbind /dev "$root/dev"  # with /dev/shm: multiprocessing needs it
    cp images/smoke.sh "$root/tmp/smoke.sh"
    mapfile -t env < <(buildah inspect --format '{{range .OCIv1.Config.Env}}{{println .}}{{end}}' "$c" | grep .)
    dir=$(buildah inspect --format '{{.OCIv1.Config.WorkingDir}}' "$c")
    rc=0
    chroot --userspec=10001:10001 "$root" /usr/bin/env -i HOME="$dir" "${env[@]}" \
        sh -c "cd '$dir' && exec sh /tmp/smoke.sh $kind" || rc=$?
    # lazily: a server the smoke run started may still be closing its files
    umount -R -l "$root/dev"; umount -l "$root/proc" "$root/tmp" && umount -l "$root" && rmdir "$root"
    buildah umount "$c" >/dev/null
    return "$rc"
}

if ! buildah inspect --type image "$BASE" >/dev/null 2>&1; then
    t0=$(now)
    rm -rf "$OUT/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm \
        "$OUT/rootfs" http://deb.debian.org/debian >"$OUT/debootstrap.log" 2>&1
    rm -rf "$OUT"/rootfs/var/cache/apt/archives/*.deb "$OUT"/rootfs/var/lib/apt/lists/*
    c=$(buildah from scratch)
    buildah copy --quiet "$c" "$OUT/rootfs" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --env LANG=C.UTF-8 --cmd /bin/bash "$c"
    buildah commit --quiet "$c" "$BASE" >/dev/null
    buildah rm "$c" >/dev/null
    build_s[base]=$(since "$t0")
    echo "base $BASE: ${build_s[base]} s (debootstrap and commit)"
fi

for kind in $KINDS; do
    args=(--build-arg "BASE_IMAGE=$BASE" --build-arg "GIT_COMMIT=$(git rev-parse HEAD)")
    case "$kind" in
    cpu)
        wheels=("$TORCH_WHEELS"/torch-2.13.0+cpu-cp311-*.whl)
        wheel=${wheels[0]}
        [ -e "$wheel" ] || { echo "no torch-2.13.0+cpu-cp311 wheel in $TORCH_WHEELS" >&2; exit 1; }
        cp -u "$wheel" images/wheels/
        args+=(--build-arg "TORCH_SOURCE=--no-index --find-links /tmp/wheels") ;;
    gpu) args+=(--build-arg PYTHON=python3.11 --build-arg TORCH_SOURCE=) ;;
    esac
    t0=$(now)
    buildah bud --layers --quiet -f "images/Dockerfile.$kind" "${args[@]}" "${mounts[@]}" \
        -t "localhost/foxhunt-$kind:$TAG" . >"$OUT/build-$kind.log" 2>&1 \
        || { tail -30 "$OUT/build-$kind.log"; echo "build of $kind failed: $OUT/build-$kind.log" >&2; exit 1; }
    build_s[$kind]=$(since "$t0")
    echo "built localhost/foxhunt-$kind:$TAG in ${build_s[$kind]} s"
    t0=$(now)
    c=$(buildah from "localhost/foxhunt-$kind:$TAG")
    if [ "$(id -u)" = 0 ]; then how=read_only_root; else how=buildah_run; fi
    "$how" "$c" "$kind" 2>&1 | grep -v -E "^(INFO|WARNING|\s)" | tee "$OUT/smoke-$kind.log"
    rc=${PIPESTATUS[0]}
    buildah rm "$c" >/dev/null
    smoke_s[$kind]=$(since "$t0")
    [ "$rc" = 0 ] || { echo "smoke run of $kind failed (exit $rc)" >&2; exit 1; }
    echo "smoke run of $kind as uid 10001: ok in ${smoke_s[$kind]} s"
done

echo
printf '%-32s %10s %10s %10s\n' image size build_s smoke_s
for kind in base $KINDS; do
    name=$([ "$kind" = base ] && echo "$BASE" || echo "localhost/foxhunt-$kind:$TAG")
    size=$(buildah images --format '{{.Size}}' "$name" | head -1)
    printf '%-32s %10s %10s %10s\n' "$name" "$size" "${build_s[$kind]:--}" "${smoke_s[$kind]:--}"
done
