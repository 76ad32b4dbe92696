//! What the RunPod adapter's tests share: the OpenAPI validator.

pub mod openapi;
