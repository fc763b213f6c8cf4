# outboxd: multi-stage build, small non-root runtime image.
#   docker build -t outboxd .
#   docker run --rm -v $PWD/outboxd.toml:/etc/outboxd/outboxd.toml:ro -v outboxd-data:/var/lib/outboxd outboxd
FROM rust:1-bookworm AS build
# librdkafka is built from source by the rdkafka crate.
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake pkg-config zlib1g-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml ./
# sled, patched (vendor/README.md), through [patch.crates-io].
COPY vendor ./vendor
COPY src ./src
# The console's templates and assets are compiled into the binary.
COPY templates ./templates
COPY assets ./assets
COPY examples ./examples
# A workspace member: cargo loads it even when building only outboxd.
COPY bench/Cargo.toml ./bench/
COPY bench/src ./bench/src
RUN cargo build --release --locked --bin outboxd --example receiver

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl libssl3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/outboxd --create-home outboxd
COPY --from=build /src/target/release/outboxd /usr/local/bin/outboxd
# The demo receiver (honours Idempotency-Key, prints what it receives).
COPY --from=build /src/target/release/examples/receiver /usr/local/bin/outboxd-demo-receiver
USER outboxd
WORKDIR /var/lib/outboxd
VOLUME ["/var/lib/outboxd"]
ENTRYPOINT ["outboxd"]
CMD ["run", "--config", "/etc/outboxd/outboxd.toml"]
