//! File types: the YAML shape of policy documents, with source spans on the
//! values that diagnostics point at. Converted into `model.rs` types by `validate.rs`.
//!
//! These types are the wire format of the policy repo and also the source of
//! the JSON Schema (`schema.rs`), so their doc comments are what editors show.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Serialize};

/// The only `apiVersion` this crate reads.
pub const API_VERSION: &str = "axle.dev/v1";

/// A value with the 1-based line and column where it appears in its YAML
/// document (relative to the document's first line, see `load.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Loc<T> {
    pub value: T,
    pub line: u32,
    pub column: u32,
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Loc<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let spanned = serde_saphyr::Spanned::<T>::deserialize(deserializer)?;
        Ok(Loc {
            value: spanned.value,
            line: u32::try_from(spanned.referenced.line()).unwrap_or(u32::MAX),
            column: u32::try_from(spanned.referenced.column()).unwrap_or(u32::MAX),
        })
    }
}

/// Spans are invisible in the schema: a `Loc<T>` is written exactly like a `T`.
impl<T: JsonSchema> JsonSchema for Loc<T> {
    fn inline_schema() -> bool {
        T::inline_schema()
    }
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn schema_id() -> Cow<'static, str> {
        T::schema_id()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

/// A YAML mapping with string keys, kept in file order with each key's
/// position, so that diagnostics can point at a key (`quotas.H100`).
#[derive(Debug, Clone, PartialEq)]
pub struct LocMap<V>(pub Vec<(Loc<String>, V)>);

impl<V> Default for LocMap<V> {
    fn default() -> Self {
        LocMap(Vec::new())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for LocMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for MapVisitor<V> {
            type Value = LocMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a mapping")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some(key) = map.next_key::<Loc<String>>()? {
                    let value = map.next_value::<V>()?;
                    entries.push((key, value));
                }
                Ok(LocMap(entries))
            }
        }
        deserializer.deserialize_map(MapVisitor(PhantomData))
    }
}

impl<V: JsonSchema> JsonSchema for LocMap<V> {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        <BTreeMap<String, V>>::schema_name()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        <BTreeMap<String, V>>::json_schema(generator)
    }
}

/// What every document is checked for before its `spec` is read: the parts
/// common to all kinds. Unknown top-level fields are rejected here.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct Header {
    pub api_version: Option<Loc<String>>,
    pub kind: Option<Loc<String>>,
    pub metadata: Option<Loc<HeaderMetadata>>,
    pub spec: Option<Loc<IgnoredAny>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeaderMetadata {
    pub name: Option<Loc<String>>,
}

/// The second pass over a document whose header is known: only `spec`.
#[derive(Debug, Deserialize)]
pub(crate) struct SpecOnly<S> {
    pub spec: S,
}

/// The policy API version.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema)]
pub enum ApiVersion {
    #[serde(rename = "axle.dev/v1")]
    V1,
}

/// Identifies the document.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    /// Unique per kind: lowercase letters, digits and `-`, at most 63 characters.
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"))]
    pub name: String,
}

/// One policy document: `apiVersion`, `metadata` and the kind's `spec`.
/// Schema only: loading reads documents in two passes (`Header`, `SpecOnly`).
#[derive(Debug, Clone, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Document<S> {
    pub api_version: ApiVersion,
    pub metadata: Metadata,
    pub spec: S,
}

/// A single Axle policy document (one of several in a file, separated by `---`).
#[derive(Debug, Clone, JsonSchema)]
#[serde(tag = "kind")]
#[schemars(title = "Axle policy document")]
pub enum PolicyDocument {
    /// A tenant: GPU quotas per class, fair-share weight, members and burst budget.
    Team(Document<TeamSpec>),
    /// A priority class and its preemption rules.
    PriorityClass(Document<PriorityClassSpec>),
    /// An on-prem cluster (one spoke): region, price and declared capacity.
    Cluster(Document<ClusterSpec>),
    /// A cloud account/region that teams may burst to.
    BurstProvider(Document<BurstProviderSpec>),
    /// Global settings; at most one document of this kind.
    Settings(Box<Document<SettingsSpec>>),
}

/// `spec` of a `Team`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TeamSpec {
    /// Quota per GPU class (`H100`, `A100`, …). `any` covers every model the team
    /// has no model-specific quota for.
    #[serde(default)]
    pub quotas: LocMap<QuotaSpec>,
    /// Fair-share weight for borrowing idle capacity (> 0, default 1).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub weight: Option<Loc<f64>>,
    #[serde(default)]
    pub members: Vec<MemberSpec>,
    /// Single sign-on groups whose users have a role in the team: a user gets
    /// the highest role of their own entry and their groups'.
    #[serde(default)]
    pub groups: Vec<GroupSpec>,
    /// Cloud overflow; omitted means no bursting.
    #[serde(default)]
    pub burst: Option<TeamBurstSpec>,
}

/// GPUs of one class; fractions must be multiples of `fractionGranularity`.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QuotaSpec {
    /// GPUs never taken away by other teams (default 0).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub guaranteed: Option<Loc<f64>>,
    /// The most GPUs the team may hold by borrowing idle capacity (default: `guaranteed`).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub limit: Option<Loc<f64>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RoleSpec {
    Admin,
    Member,
    Viewer,
}

/// A group of the ID tokens' groups claim (`axle-hub --oidc-groups-claim`).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GroupSpec {
    pub group: Loc<String>,
    /// Default `member`.
    #[serde(default)]
    pub role: Option<RoleSpec>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct MemberSpec {
    pub user: Loc<String>,
    /// Default `member`.
    #[serde(default)]
    pub role: Option<RoleSpec>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct TeamBurstSpec {
    /// Monthly cloud spend cap in USD (default 0: no bursting).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub budget_usd_per_month: Option<Loc<f64>>,
    /// Names of `BurstProvider` documents the team may use.
    #[serde(default)]
    pub providers: Vec<Loc<String>>,
    /// Regions the team's data may go to (data residency); empty means any.
    #[serde(default)]
    pub regions: Vec<Loc<String>>,
}

/// `spec` of a `PriorityClass`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PriorityClassSpec {
    /// Higher runs first.
    pub value: Loc<i32>,
    /// Classes whose workloads may preempt this one; empty means never preempted.
    #[serde(default)]
    pub preemptible_by: Vec<Loc<String>>,
    /// SIGTERM → SIGKILL grace period when preempted (default 30).
    #[serde(default)]
    pub grace_period_seconds: Option<Loc<u64>>,
    /// Runs only on capacity nothing else wants (default false).
    #[serde(default)]
    pub idle_only: Option<bool>,
    /// May workloads of this class burst to the cloud (default true).
    #[serde(default)]
    pub burst_allowed: Option<bool>,
    /// Workloads save their progress and resume after preemption (default false).
    #[serde(default)]
    pub checkpointable: Option<bool>,
    /// How often a checkpointable workload saves on its own (default 1800).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub checkpoint_interval_seconds: Option<Loc<i64>>,
    /// Signal sent at preemption to a checkpointable workload (default SIGTERM).
    #[serde(default)]
    pub checkpoint_signal: Option<Loc<String>>,
    /// How a replica larger than one node is laid out: `wholeNodes`
    /// (default), `packed` or `spread`.
    #[serde(default)]
    pub placement: Option<Loc<String>>,
    /// Not preempted by priority before running this long (default 0).
    #[serde(default)]
    pub min_runtime_seconds: Option<Loc<u64>>,
    /// A waiting workload estimated to fit within this long does not
    /// preempt by priority (default 0).
    #[serde(default)]
    pub tolerable_wait_seconds: Option<Loc<u64>>,
}

/// `spec` of a `Cluster`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClusterSpec {
    pub region: Loc<String>,
    #[serde(default)]
    pub business_unit: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Internal chargeback price (default 0).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub price_usd_per_gpu_hour: Option<Loc<f64>>,
    /// Declared capacity for planning; the spoke's live inventory overrides it.
    #[serde(default)]
    pub nodes: Vec<NodeGroupSpec>,
    /// Container image for workloads that name none, on a cluster whose spoke
    /// runs Kubernetes Jobs (without it, such workloads run elsewhere).
    #[serde(default)]
    pub default_image: Option<Loc<String>>,
}

/// `count` identical nodes.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct NodeGroupSpec {
    #[schemars(range(min = 1))]
    pub count: Loc<u64>,
    pub gpu_model: Loc<String>,
    #[schemars(range(min = 1))]
    pub gpus_per_node: Loc<u64>,
    /// Memory per GPU (default 0: unknown).
    #[serde(default)]
    pub gpu_memory_gb: Option<u64>,
    /// The topology domain of these nodes (a rack, an NVLink or InfiniBand
    /// block): replicas of a job larger than one node prefer one domain.
    #[serde(default)]
    pub topology: Option<Loc<String>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ProviderTypeSpec {
    Aws,
    Runpod,
    Lambda,
}

/// `spec` of a `BurstProvider`.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BurstProviderSpec {
    #[serde(rename = "type")]
    pub provider_type: ProviderTypeSpec,
    /// Provider regions this account may launch in.
    pub regions: Vec<Loc<String>>,
    /// Allowed instance types (AWS) or GPU types (RunPod, Lambda).
    #[serde(default)]
    pub instance_types: Vec<String>,
    #[serde(default)]
    pub gpu_models: Vec<Loc<String>>,
    /// The most instances alive at once through this provider.
    pub max_instances: Loc<u64>,
    /// Hourly prices per instance type (`aws`: EC2 has no price API, so the
    /// policy's table is the catalog's price; others: optional overrides).
    #[serde(default)]
    pub prices: BTreeMap<String, PriceSpec>,
    /// Spot (interruptible) capacity may be used for workloads of classes
    /// that allow burst (default false).
    #[serde(default)]
    pub allow_spot: Option<bool>,
    /// The machine image (`aws`: an AMI per region, `region: ami-…`) or
    /// container image (`runpod`) instances boot with `axle-spoke` in it.
    #[serde(default)]
    pub images: BTreeMap<String, String>,
    /// An instance whose spoke has not joined this long after launch is
    /// terminated (default 600).
    #[serde(default)]
    pub join_timeout_seconds: Option<Loc<u64>>,
    /// An instance with no work this long is terminated (default 300).
    #[serde(default)]
    pub idle_timeout_seconds: Option<Loc<u64>>,
}

/// Hourly prices of one instance type, in US dollars.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PriceSpec {
    #[schemars(range(min = 0))]
    pub on_demand: Loc<f64>,
    /// Spot price to assume when spot is allowed (none: on-demand only).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub spot: Option<Loc<f64>>,
}

/// `spec` of the `Settings` document.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct SettingsSpec {
    /// Fractional GPU step (default 0.25); must divide 1 exactly.
    #[serde(default)]
    pub fraction_granularity: Option<Loc<f64>>,
    /// On-prem wait before a burst is wanted (default 300).
    #[serde(default)]
    pub burst_wait_threshold_seconds: Option<Loc<u64>>,
    /// A cap on all teams' cloud spend together per month (default: none).
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub burst_budget_usd_per_month: Option<Loc<f64>>,
    /// How long a burst is reserved for when its workload names no maximum
    /// run time (default 3600).
    #[serde(default)]
    pub default_burst_runtime_seconds: Option<Loc<u64>>,
    /// A spoke silent this long is lost (default 30).
    #[serde(default)]
    pub spoke_lost_after_seconds: Option<Loc<u64>>,
    /// Priority class of workloads that name none (default `development`).
    #[serde(default)]
    pub default_priority_class: Option<Loc<String>>,
    /// `borrowedOnly` (default): another team's work is preempted only from
    /// what that team borrows; `any`: priority may take any team's GPUs.
    #[serde(default)]
    #[schemars(extend("enum" = ["borrowedOnly", "any"]))]
    pub cross_team_preemption: Option<Loc<String>>,
    /// GPU models beyond the built-in list.
    #[serde(default)]
    pub gpu_classes: Vec<Loc<String>>,
    /// Hours a finished workload (its record and logs) is kept before it is
    /// deleted (default 168, one week; fractions allowed, at least a minute).
    #[serde(default)]
    pub retain_finished_hours: Option<Loc<f64>>,
    /// Days events are kept (default 90; fractions allowed, at least a minute).
    #[serde(default)]
    pub retain_events_days: Option<Loc<f64>>,
    /// Bytes of log kept per workload run, on the hub and on the spoke: the
    /// head and the most recent tail, with a line saying what was cut
    /// (default 67108864, 64 MiB).
    #[serde(default)]
    pub max_log_bytes_per_workload: Option<Loc<u64>>,
    /// Users who may do anything on the hub: every team's work, API tokens.
    #[serde(default)]
    pub platform_admins: Vec<Loc<String>>,
    /// The memory one whole GPU of a model means when a fraction is sized
    /// on a MIG device, in GB: with `H100: 80`, 0.25 needs 20 GB — a
    /// `2g.20gb` device or larger, never `1g.10gb` (default: the memory
    /// the node reports for the whole GPU).
    #[serde(default)]
    pub fraction_memory_gb: BTreeMap<String, Loc<u64>>,
    /// Most nodes a spoke may report for a Cluster that declares no
    /// `nodes` (default 10000, at most 10000).
    #[serde(default)]
    pub max_nodes_per_cluster: Option<Loc<u64>>,
    /// Most GPUs one node may report on a Cluster that declares no `nodes`
    /// (default 16, at most 64).
    #[serde(default)]
    pub max_gpus_per_node: Option<Loc<u64>>,
    /// Most memory one GPU may report on a Cluster that declares no
    /// `nodes`, in GB (default 288).
    #[serde(default)]
    pub max_gpu_memory_gb: Option<Loc<u64>>,
}
