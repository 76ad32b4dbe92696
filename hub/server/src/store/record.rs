//! The versioned on-disk envelope of one key's record, and the rules for migrating it.
//!
//! Layout of version 1 (all integers little-endian):
//!
//! ```text
//! [version: u8 = 1][mod_rev: u64][lease: u64, 0 = none][value bytes ...]
//! ```
//!
//! Migration rules (STYLE #12):
//! - The first byte is the record version. A reader decodes every version it knows; writers
//!   always write [`RECORD_VERSION`]. Old records are rewritten lazily, when next put.
//! - A new layout gets the next version number and a new arm in [`decode`]; the old arm stays
//!   until no supported data directory can hold it.
//! - A record with a version newer than this binary knows is reported as corrupt rather than
//!   guessed at: a downgraded hub must not silently misread data.
//! - Changes to the table layout itself (not a record) bump `FORMAT_VERSION` in the meta table,
//!   checked when the store opens.

use super::{LeaseId, Rev, StoreError};

/// The version this binary writes.
pub(crate) const RECORD_VERSION: u8 = 1;

/// Bytes before the value in a version 1 record.
const V1_HEADER_BYTES: usize = 1 + 8 + 8;

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub mod_rev: Rev,
    pub lease: Option<LeaseId>,
    pub value: Vec<u8>,
}

/// Encodes a record in the current version.
pub(crate) fn encode(mod_rev: Rev, lease: Option<LeaseId>, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(V1_HEADER_BYTES + value.len());
    out.push(RECORD_VERSION);
    out.extend_from_slice(&mod_rev.to_le_bytes());
    out.extend_from_slice(&lease.unwrap_or(0).to_le_bytes());
    out.extend_from_slice(value);
    out
}

/// Decodes a record of any supported version. `key` only labels errors.
pub(crate) fn decode(key: &str, bytes: &[u8]) -> Result<Record, StoreError> {
    let (mod_rev, lease, value) = decode_parts(key, bytes)?;
    Ok(Record {
        mod_rev,
        lease,
        value: value.to_vec(),
    })
}

/// Decodes only the header (revision and lease), without copying the value.
pub(crate) fn decode_header(key: &str, bytes: &[u8]) -> Result<(Rev, Option<LeaseId>), StoreError> {
    let (mod_rev, lease, _) = decode_parts(key, bytes)?;
    Ok((mod_rev, lease))
}

fn decode_parts<'b>(
    key: &str,
    bytes: &'b [u8],
) -> Result<(Rev, Option<LeaseId>, &'b [u8]), StoreError> {
    let corrupt = |message: String| StoreError::Corrupt {
        key: key.to_owned(),
        message,
    };
    match bytes.first() {
        None => Err(corrupt("empty record".to_owned())),
        Some(1) => {
            if bytes.len() < V1_HEADER_BYTES {
                return Err(corrupt(format!(
                    "version 1 record of {} bytes is shorter than its {V1_HEADER_BYTES}-byte header",
                    bytes.len()
                )));
            }
            let mod_rev = u64_at(bytes, 1);
            let lease = u64_at(bytes, 9);
            Ok((
                mod_rev,
                (lease != 0).then_some(lease),
                &bytes[V1_HEADER_BYTES..],
            ))
        }
        Some(version) => Err(corrupt(format!(
            "record version {version} is not supported by this binary (newest known: {RECORD_VERSION})"
        ))),
    }
}

/// Reads a little-endian u64 at `at`; the caller checked the length.
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_and_without_lease() {
        let bytes = encode(42, Some(7), b"hello");
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(
            decode("k", &bytes).unwrap(),
            Record {
                mod_rev: 42,
                lease: Some(7),
                value: b"hello".to_vec()
            }
        );
        let bytes = encode(1, None, b"");
        assert_eq!(decode_header("k", &bytes).unwrap(), (1, None));
        assert_eq!(decode("k", &bytes).unwrap().value, Vec::<u8>::new());
    }

    #[test]
    fn rejects_unknown_version_and_truncation() {
        let mut bytes = encode(3, None, b"x");
        bytes[0] = 9;
        let err = decode("k", &bytes).unwrap_err();
        assert!(
            matches!(err, StoreError::Corrupt { ref message, .. } if message.contains("version 9"))
        );
        assert!(matches!(decode("k", &[]), Err(StoreError::Corrupt { .. })));
        assert!(matches!(
            decode("k", &[1, 2, 3]),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
