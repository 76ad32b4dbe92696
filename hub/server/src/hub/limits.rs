//! The core's named limits and periods, each with its reason.

/// Commands one applier batch takes at most: one fsync per batch, so 4,096
/// submits commit together under load while a batch still applies in a few ms.
pub const MAX_COMMANDS_PER_BATCH: usize = 4096;

/// Queue of commands waiting for the applier. Callers wait on a full queue
/// (backpressure) instead of growing memory without bound.
pub const COMMAND_QUEUE: usize = 65_536;

/// Messages queued to one spoke: a full queue means the spoke stopped
/// reading; its connection is dropped and it re-registers.
pub const SPOKE_QUEUE: usize = 16_384;

/// How often spokes heartbeat.
pub const HEARTBEAT_INTERVAL_MS: u64 = 1000;

/// Slack between a lost spoke fencing itself (no ack for `spokeLostAfter`,
/// then the grace period) and the hub re-queueing its workloads: covers the
/// last ack's trip and a missed heartbeat.
pub const FENCE_MARGIN_MS: u64 = 2 * HEARTBEAT_INTERVAL_MS;

/// Housekeeping tick: lost spokes, retention, burst thresholds, and a cycle
/// even when nothing changed (reasons age, waits pass thresholds).
pub const TICK_MS: u64 = 1000;

/// Events kept in memory (and in every read snapshot) for `GET
/// /api/v1/events`; older ones are read from the store.
pub const EVENTS_IN_MEMORY: usize = 10_000;

/// Below this many waiting workloads every cycle explains all of them (a
/// cycle over 10,000 costs a few ms).
pub const EXPLAIN_ALWAYS_BELOW: usize = 10_000;

/// With a deeper queue, pending reasons are refreshed at most this often.
pub const EXPLAIN_EVERY_MS: u64 = 1000;

/// Grace period of a workload whose priority class is no longer in the policy.
pub const DEFAULT_GRACE_S: u64 = 30;
