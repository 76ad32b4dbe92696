//! Helpers shared by the provider tests.

pub mod openapi;
