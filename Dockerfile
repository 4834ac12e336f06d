# syntax=docker/dockerfile:1.7
# One image with both node binaries: /usr/bin/dra-plugin and /usr/bin/nri-plugin.
# The chart runs each as its own container from this image.
#
#   docker build -t <registry>/dra-cpu:<version> .
#
# The runtime stage is distroless (glibc, no shell, no package manager): the
# binaries link only against glibc and libgcc_s, which the base carries (the
# builder is the same Debian release, so the glibc versions agree).
# Both processes run as root (docs/user/install.md, "Privileges"), so USER is 0.

ARG RUST_IMAGE=rust:1.89-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# protoc comes from the protoc-bin-vendored crate: no system protobuf needed.
# --locked: the image is built from exactly the committed Cargo.lock.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p dra-plugin -p nri-plugin \
 && install -D -m 0755 target/release/dra-plugin /out/dra-plugin \
 && install -D -m 0755 target/release/nri-plugin /out/nri-plugin

FROM ${RUNTIME_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="dra-cpu" \
      org.opencontainers.image.description="Kubernetes DRA driver for exclusive CPUs, with a containerd NRI plugin that pins them" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/dra-plugin /out/nri-plugin /usr/bin/
USER 0:0
ENTRYPOINT ["/usr/bin/dra-plugin"]
CMD ["--help"]
