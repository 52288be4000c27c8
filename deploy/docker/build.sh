#!/bin/sh
# The image's build: the release switchyard binary (with Kubernetes pod discovery,
# which the binary always enables) copied into OUT_DIR. The Dockerfile's build stage
# runs it, and `cargo xtask ci` runs it on the files that stage is given, so the
# image's build is the one CI checks (docs/operations.md, "The image").
set -eu
if [ "$#" -ne 1 ]; then
    echo "usage: $0 OUT_DIR" >&2
    exit 2
fi
mkdir -p "$1"
out="$(cd "$1" && pwd)"
cd "$(dirname "$0")/../.."
"${CARGO:-cargo}" build --locked --release -p switchyard
cp "${CARGO_TARGET_DIR:-target}/release/switchyard" "$out/switchyard"
