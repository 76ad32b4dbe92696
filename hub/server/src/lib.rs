//! Axle's hub: the control plane process. It holds the policy, keeps every
//! accepted workload and decision in a durable store, runs the scheduling
//! loop over `axle-scheduler`, talks to spokes over gRPC, and serves the
//! HTTP/JSON and gRPC user APIs.

pub mod dev;
pub mod grpc;
pub mod http;
pub mod hub;
pub mod isolation;
pub mod lifecycle;
pub mod logs;
pub mod records;
pub mod server;
pub mod store;
pub mod views;
