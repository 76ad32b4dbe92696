//! The adversary suite: what one spoke, one user or one hung process tries
//! against a real hub (release or debug binaries on loopback), and what
//! must hold — the hub keeps serving everyone else, refuses with a reason,
//! and never runs a workload twice. Each scenario prints its figures
//! (`adversary: …`), which the closing notes quote.

mod connections;
mod harness;
mod hung;
mod input;
mod inventory;
mod joins;
mod replicas;
mod slots;
