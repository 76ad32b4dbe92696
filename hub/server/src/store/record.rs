//! The versioned on-disk envelope of one key's record, and the rules for migrating it.
//!
//! Layout of version 2, written now (all integers little-endian):
//!
//! ```text
//! [version: u8 = 2][mod_rev: u64][create_rev: u64][version: u64][lease: u64, 0 = none][value ...]
//! ```
//!
//! Version 1 had no `create_rev` and no `version`: `[1][mod_rev][lease][value ...]`. It is read
//! as created at its `mod_rev` with version 1 (the history before it is not known), and
//! rewritten in version 2 when next put.
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
pub(crate) const RECORD_VERSION: u8 = 2;

/// Bytes before the value in a version 1 record.
const V1_HEADER_BYTES: usize = 1 + 8 + 8;
/// Bytes before the value in a version 2 record.
const V2_HEADER_BYTES: usize = 1 + 8 + 8 + 8 + 8;

/// A record's metadata: what etcd keeps beside a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub mod_rev: Rev,
    pub create_rev: Rev,
    pub version: u64,
    pub lease: Option<LeaseId>,
}

/// One decoded record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    pub header: Header,
    pub value: Vec<u8>,
}

/// Encodes a record in the current version.
pub(crate) fn encode(h: &Header, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(V2_HEADER_BYTES + value.len());
    out.push(RECORD_VERSION);
    for word in [h.mod_rev, h.create_rev, h.version, h.lease.unwrap_or(0)] {
        out.extend_from_slice(&word.to_le_bytes());
    }
    out.extend_from_slice(value);
    out
}

/// Decodes a record of any supported version. `key` only labels errors.
pub(crate) fn decode(key: &str, bytes: &[u8]) -> Result<Record, StoreError> {
    let (header, value) = decode_parts(key, bytes)?;
    Ok(Record {
        header,
        value: value.to_vec(),
    })
}

/// Decodes only the header, without copying the value.
pub(crate) fn decode_header(key: &str, bytes: &[u8]) -> Result<Header, StoreError> {
    decode_parts(key, bytes).map(|(h, _)| h)
}

fn decode_parts<'b>(key: &str, bytes: &'b [u8]) -> Result<(Header, &'b [u8]), StoreError> {
    let corrupt = |message: String| StoreError::Corrupt {
        key: key.to_owned(),
        message,
    };
    let need = |version: u8, header: usize| {
        if bytes.len() < header {
            Err(corrupt(format!(
                "version {version} record of {} bytes is shorter than its {header}-byte header",
                bytes.len()
            )))
        } else {
            Ok(())
        }
    };
    let lease = |word: u64| (word != 0).then_some(word);
    match bytes.first() {
        None => Err(corrupt("empty record".to_owned())),
        Some(1) => {
            need(1, V1_HEADER_BYTES)?;
            let mod_rev = u64_at(bytes, 1);
            let header = Header {
                mod_rev,
                create_rev: mod_rev,
                version: 1,
                lease: lease(u64_at(bytes, 9)),
            };
            Ok((header, &bytes[V1_HEADER_BYTES..]))
        }
        Some(2) => {
            need(2, V2_HEADER_BYTES)?;
            let header = Header {
                mod_rev: u64_at(bytes, 1),
                create_rev: u64_at(bytes, 9),
                version: u64_at(bytes, 17),
                lease: lease(u64_at(bytes, 25)),
            };
            Ok((header, &bytes[V2_HEADER_BYTES..]))
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
        let h = Header {
            mod_rev: 42,
            create_rev: 40,
            version: 3,
            lease: Some(7),
        };
        let bytes = encode(&h, b"hello");
        assert_eq!(bytes[0], RECORD_VERSION);
        assert_eq!(
            decode("k", &bytes).unwrap(),
            Record {
                header: h,
                value: b"hello".to_vec()
            }
        );
        let h = Header { lease: None, ..h };
        let bytes = encode(&h, b"");
        assert_eq!(decode_header("k", &bytes).unwrap(), h);
        assert_eq!(decode("k", &bytes).unwrap().value, Vec::<u8>::new());
    }

    #[test]
    fn a_version_1_record_reads_as_created_at_its_revision() {
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&9u64.to_le_bytes());
        v1.extend_from_slice(&5u64.to_le_bytes());
        v1.extend_from_slice(b"old");
        let r = decode("k", &v1).unwrap();
        assert_eq!(
            r.header,
            Header {
                mod_rev: 9,
                create_rev: 9,
                version: 1,
                lease: Some(5)
            }
        );
        assert_eq!(r.value, b"old");
    }

    #[test]
    fn rejects_unknown_version_and_truncation() {
        let h = Header {
            mod_rev: 3,
            create_rev: 3,
            version: 1,
            lease: None,
        };
        let mut bytes = encode(&h, b"x");
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
        assert!(matches!(
            decode("k", &[2; 20]),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
