//! The test server driven by real kube-rs clients: CRUD, the Job
//! controller, delete propagation, watch/reflector semantics, restarts,
//! ResourceQuota admission, logs and selectors.

mod crud;
mod jobs;
mod logs;
mod quota;
mod scheduling;
mod selectors;
mod support;
mod watch;
