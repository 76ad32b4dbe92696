//! Helpers shared by the provider tests: the OpenAPI validator their fakes
//! check requests and answers with. Each test binary uses part of it.

#![allow(dead_code)]

pub mod openapi;
