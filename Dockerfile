# The Axle image: axle-hub, axle-spoke and the axle CLI on a slim base.
# Used by deploy/kind-up.sh and the kustomize bases (image `axle`).
FROM rust:1.95-bookworm AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin axle-hub --bin axle-spoke --bin axle

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/axle-hub /src/target/release/axle-spoke /src/target/release/axle /usr/local/bin/
USER 65532:65532
