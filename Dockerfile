# Controller image of karpenter-rs.
#
#   docker build -t <registry>/karpenter-rs/controller:0.1.0 .
#
# Multi-arch (the builder compiles for the platform it runs on):
#
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     -t <registry>/karpenter-rs/controller:0.1.0 --push .
#
# Stage 1 compiles the release binary; stage 2 is a distroless runtime with
# nothing but glibc, CA certificates and the binary, running as uid/gid 65532
# (the ids the Helm chart expects). CI runs stage 1's own instructions, read
# from this file, without a container engine (hack/dockerfile_stage.py), so
# the builder stage writes nothing outside its WORKDIR.

FROM rust:1.95-bookworm AS builder
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src

# Dependencies first: with only the manifests and stub sources, this layer is
# rebuilt only when Cargo.toml or Cargo.lock change. Every [[bench]] target
# Cargo.toml declares gets a stub too, read from the manifest itself.
COPY Cargo.toml Cargo.lock ./
# Build settings (the allocator's configuration).
COPY .cargo ./.cargo
RUN mkdir -p src benches \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && sed -n '/^\[\[bench\]\]/,/^name/ s/^name *= *"\(.*\)"/\1/p' Cargo.toml \
       | while read -r bench; do touch "benches/$bench.rs"; done \
    && cargo build --release --locked --bin karpenter \
    && rm -rf src benches

# The real sources. Touching them makes sure cargo rebuilds the crate itself
# rather than trusting the stub build's timestamps.
COPY src ./src
# Not built into the image, but Cargo.toml declares the benchmark target.
COPY benches ./benches
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked --bin karpenter \
    && ./target/release/karpenter --version

FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="karpenter-rs" \
      org.opencontainers.image.description="Kubernetes node autoscaler for Amazon EKS, compatible with Karpenter" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=builder /src/target/release/karpenter /karpenter
USER 65532:65532
ENTRYPOINT ["/karpenter"]
