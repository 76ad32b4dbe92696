//! Typed helpers over the byte-valued `Store`: values as JSON, for any serde type.
//!
//! These carry no version of their own: the store's record envelope is versioned, and the types
//! the hub stores are its storage types (not domain types), which version their own schema.

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{KeyValue, LeaseId, Op, Rev, Store, StoreError};

/// A put of `value` serialized as JSON.
pub fn put_json<T: Serialize + ?Sized>(
    key: impl Into<String>,
    value: &T,
) -> Result<Op, StoreError> {
    put_json_inner(key.into(), value, None)
}

/// A put of `value` serialized as JSON, attached to a lease.
pub fn put_json_with_lease<T: Serialize + ?Sized>(
    key: impl Into<String>,
    value: &T,
    lease: LeaseId,
) -> Result<Op, StoreError> {
    put_json_inner(key.into(), value, Some(lease))
}

fn put_json_inner<T: Serialize + ?Sized>(
    key: String,
    value: &T,
    lease: Option<LeaseId>,
) -> Result<Op, StoreError> {
    match serde_json::to_vec(value) {
        Ok(value) => Ok(Op::Put { key, value, lease }),
        Err(e) => Err(StoreError::Encode {
            key,
            message: e.to_string(),
        }),
    }
}

/// Decodes a key's JSON value.
pub fn decode_json<T: DeserializeOwned>(kv: &KeyValue) -> Result<T, StoreError> {
    serde_json::from_slice(&kv.value).map_err(|e| StoreError::Decode {
        key: kv.key.clone(),
        message: e.to_string(),
    })
}

/// Reads a key as JSON, with its revision (for a later compare-and-swap).
pub async fn get_json<T: DeserializeOwned, S: Store + ?Sized>(
    store: &S,
    key: &str,
) -> Result<Option<(T, Rev)>, StoreError> {
    match store.get(key).await? {
        Some(kv) => Ok(Some((decode_json(&kv)?, kv.mod_rev))),
        None => Ok(None),
    }
}

/// Reads every key under `prefix` as JSON, sorted by key: `(key, value, mod_rev)`.
pub async fn range_json<T: DeserializeOwned, S: Store + ?Sized>(
    store: &S,
    prefix: &str,
) -> Result<Vec<(String, T, Rev)>, StoreError> {
    store
        .range(prefix)
        .await?
        .into_iter()
        .map(|kv| {
            let value = decode_json(&kv)?;
            Ok((kv.key, value, kv.mod_rev))
        })
        .collect()
}
