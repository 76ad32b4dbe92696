//! A Kubernetes API test server on loopback (plain HTTP) with the semantics
//! the spoke's kubernetes driver relies on. (Being written.)
