//! JSON Schema export of one policy document, for editors
//! (yaml-language-server) and for `axle policy schema`.

use crate::file::PolicyDocument;

/// The JSON Schema (draft 2020-12) of a single policy document: one variant per
/// `kind`, each with `apiVersion`, `metadata.name` and that kind's `spec`.
pub fn json_schema() -> serde_json::Value {
    let schema = schemars::schema_for!(PolicyDocument);
    schema.to_value()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_names_every_kind_and_rejects_unknown_fields() {
        let s = json_schema();
        let text = s.to_string();
        for kind in [
            "Team",
            "PriorityClass",
            "Cluster",
            "BurstProvider",
            "Settings",
        ] {
            assert!(text.contains(&format!("\"{kind}\"")), "{kind} missing");
        }
        assert!(text.contains("axle.dev/v1"));
        assert!(text.contains("budgetUsdPerMonth"));
        assert!(text.contains("\"additionalProperties\":false"));
    }
}
