//! The revision of a policy read from plain files: a content hash of its
//! sorted (path, content) pairs, so the same files give the same revision.

/// `fnv1a64-<hex>` over the sorted (path, content) pairs, each part length-prefixed
/// so that moving bytes between a path and a content changes the hash.
pub(crate) fn revision_of(sorted: &[&(String, String)]) -> String {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    let mut feed = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(PRIME);
        }
    };
    for (path, content) in sorted {
        feed(&(path.len() as u64).to_le_bytes());
        feed(path.as_bytes());
        feed(&(content.len() as u64).to_le_bytes());
        feed(content.as_bytes());
    }
    format!("fnv1a64-{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn revision_is_order_independent_and_content_sensitive() {
        let a = ("a.yaml".to_string(), "x".to_string());
        let b = ("b.yaml".to_string(), "y".to_string());
        let r1 = revision_of(&[&a, &b]);
        assert!(r1.starts_with("fnv1a64-"));
        assert_eq!(r1.len(), "fnv1a64-".len() + 16);
        let b2 = ("b.yaml".to_string(), "z".to_string());
        assert_ne!(r1, revision_of(&[&a, &b2]));
    }
}
