//! Axle's wire types: the generated gRPC code (`pb`) and the HTTP/JSON API
//! types (`api`). Storage and domain types live elsewhere; conversions happen
//! in one module per boundary in the hub.

pub mod api;

/// Generated from `proto/axle/v1/axle.proto`.
pub mod pb {
    #![allow(clippy::all, clippy::pedantic)]
    tonic::include_proto!("axle.v1");
}
