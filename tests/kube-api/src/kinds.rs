//! The resource kinds the server stores, as one enum of k8s-openapi types, and
//! the per-kind facts (path, group, scope, status subresource) routing needs.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, ResourceQuota};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta, WatchEvent};
use k8s_openapi::{List, Metadata, Resource};
use serde_json::Value;

/// The type of a change in the watch history (the `type` of a watch event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ChangeType {
    Added,
    Modified,
    Deleted,
}

// One macro keeps the kind table, the object enum and the per-kind
// (de)serialization in step: adding a kind is one line.
macro_rules! kinds {
    ($($variant:ident($ty:ty), namespaced: $ns:expr, status: $st:expr;)*) => {
        /// A stored resource kind.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub(crate) enum Kind { $($variant),* }

        /// A stored object, typed by its kind.
        // Pods and Jobs are a few KB and the rest smaller; boxing would only
        // trade memory on the few small objects for an indirection on all.
        #[allow(clippy::large_enum_variant)]
        #[derive(Clone, Debug)]
        pub(crate) enum Object { $($variant($ty)),* }

        impl Kind {
            /// Every kind, for discovery and path lookup.
            pub(crate) const ALL: &'static [Kind] = &[$(Kind::$variant),*];

            /// The URL plural ("pods").
            pub(crate) fn plural(self) -> &'static str {
                match self { $(Kind::$variant => <$ty as Resource>::URL_PATH_SEGMENT),* }
            }
            /// The API group, "" for core.
            pub(crate) fn group(self) -> &'static str {
                match self { $(Kind::$variant => <$ty as Resource>::GROUP),* }
            }
            /// The API version within the group ("v1").
            pub(crate) fn version(self) -> &'static str {
                match self { $(Kind::$variant => <$ty as Resource>::VERSION),* }
            }
            /// The `apiVersion` field value ("batch/v1").
            pub(crate) fn api_version(self) -> &'static str {
                match self { $(Kind::$variant => <$ty as Resource>::API_VERSION),* }
            }
            /// The `kind` field value ("Job").
            pub(crate) fn name(self) -> &'static str {
                match self { $(Kind::$variant => <$ty as Resource>::KIND),* }
            }
            /// Whether objects live in a namespace.
            pub(crate) fn namespaced(self) -> bool {
                match self { $(Kind::$variant => $ns),* }
            }
            /// Whether the kind has a `status` subresource, so that a main-resource
            /// write keeps the stored status and a status write keeps the rest.
            pub(crate) fn has_status(self) -> bool {
                match self { $(Kind::$variant => $st),* }
            }
            /// Decodes a request body into the typed object (k8s-openapi checks
            /// `apiVersion`/`kind` when present).
            pub(crate) fn decode(self, value: Value) -> Result<Object, serde_json::Error> {
                match self { $(Kind::$variant => serde_json::from_value::<$ty>(value).map(Object::$variant)),* }
            }
            /// A `k8s_openapi::List` of this kind, as JSON.
            pub(crate) fn list_json(self, items: Vec<Object>, metadata: ListMeta) -> Vec<u8> {
                match self {
                    $(Kind::$variant => {
                        let items = items.into_iter().filter_map(|o| match o { Object::$variant(x) => Some(x), _ => None }).collect();
                        to_json(&List::<$ty> { items, metadata })
                    })*
                }
            }
        }

        impl Object {
            /// The object's kind.
            pub(crate) fn kind(&self) -> Kind {
                match self { $(Object::$variant(_) => Kind::$variant),* }
            }
            /// The object's metadata.
            pub(crate) fn meta(&self) -> &ObjectMeta {
                match self { $(Object::$variant(o) => o.metadata()),* }
            }
            /// The object's metadata, mutably.
            pub(crate) fn meta_mut(&mut self) -> &mut ObjectMeta {
                match self { $(Object::$variant(o) => o.metadata_mut()),* }
            }
            /// The object as a JSON value (with `apiVersion` and `kind`).
            pub(crate) fn to_value(&self) -> Value {
                match self { $(Object::$variant(o) => serde_json::to_value(o).unwrap_or(Value::Null)),* }
            }
            /// The object as JSON bytes.
            pub(crate) fn to_json(&self) -> Vec<u8> {
                match self { $(Object::$variant(o) => to_json(o)),* }
            }
            /// One watch event line (without the newline) for this object.
            pub(crate) fn watch_event_json(&self, ty: ChangeType) -> Vec<u8> {
                match self {
                    $(Object::$variant(o) => {
                        let o = o.clone();
                        to_json(&match ty {
                            ChangeType::Added => WatchEvent::Added(o),
                            ChangeType::Modified => WatchEvent::Modified(o),
                            ChangeType::Deleted => WatchEvent::Deleted(o),
                        })
                    })*
                }
            }
        }
    };
}

kinds! {
    Namespace(Namespace), namespaced: false, status: true;
    Node(Node), namespaced: false, status: true;
    PriorityClass(PriorityClass), namespaced: false, status: false;
    Pod(Pod), namespaced: true, status: true;
    Job(Job), namespaced: true, status: true;
    ResourceQuota(ResourceQuota), namespaced: true, status: true;
    Role(Role), namespaced: true, status: false;
    RoleBinding(RoleBinding), namespaced: true, status: false;
    Event(Event), namespaced: true, status: false;
}

impl Kind {
    /// Finds the kind served at `group/version/plural`.
    pub(crate) fn from_path(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL
            .iter()
            .copied()
            .find(|k| k.group() == group && k.version() == version && k.plural() == plural)
    }

    /// The resource name used in API messages: "pods", "jobs.batch".
    pub(crate) fn resource(self) -> String {
        if self.group().is_empty() {
            self.plural().to_string()
        } else {
            format!("{}.{}", self.plural(), self.group())
        }
    }

    /// The kind name used in validation messages: "Pod", "Job.batch".
    pub(crate) fn qualified_name(self) -> String {
        if self.group().is_empty() {
            self.name().to_string()
        } else {
            format!("{}.{}", self.name(), self.group())
        }
    }
}

/// Serializes a value that cannot fail to serialize (k8s-openapi types and
/// JSON values: string keys only).
pub(crate) fn to_json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}
