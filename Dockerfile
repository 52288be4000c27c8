# syntax=docker/dockerfile:1
# The router's image, built from the repository root:
#
#     docker build -t switchyard:0.1.0 .
#     docker run --rm -p 8000:8000 -v "$PWD/router.yaml:/etc/switchyard/router.yaml:ro" switchyard:0.1.0
#
# (docs/operations.md, "The image"). `cargo xtask ci` reads this file: the build stage
# runs deploy/docker/build.sh, and CI runs that script on the files the stage copies.

# The toolchain rust-toolchain.toml pins, on the runtime's Debian release.
FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock rust-toolchain.toml ./
COPY .cargo .cargo
COPY benches benches
COPY bins bins
COPY crates crates
COPY testdata testdata
COPY third_party third_party
COPY xtask xtask
COPY deploy/docker/build.sh deploy/docker/build.sh
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target,sharing=locked \
    sh deploy/docker/build.sh /out

# glibc, libgcc and CA certificates; no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/switchyard /usr/local/bin/switchyard
# Numeric, so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8000
ENTRYPOINT ["/usr/local/bin/switchyard"]
CMD ["serve", "--config", "/etc/switchyard/router.yaml"]
