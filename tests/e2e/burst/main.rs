//! Cloud burst end to end, with the binaries: a hub (`--burst`, TLS from its
//! own CA), an on-prem spoke that joins with a join token, and either a
//! loopback fake of Lambda Cloud's API (every request and answer checked
//! against the saved OpenAPI spec) whose instances "boot" by running their
//! user-data — which starts a real `axle-spoke` with its one-time join
//! token — or `moto_server` for EC2.
//!
//! One binary, scenarios one at a time (`harness::SERIAL`): `lambda` (the
//! lifecycle, a kill -9 mid-launch, a reclaim), `guards` (residency,
//! thresholds, a provider answering 500), `runpod` (the lifecycle and the
//! reaper on RunPod's spec-checked fake), `spot` (spot instances on moto:
//! taken back, and given notice) and `fleet` (200 wishes on moto).

mod fleet;
mod guards;
mod harness;
mod lambda;
mod runpod;
mod spot;
