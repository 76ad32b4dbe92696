//! Diagnostics: one error or warning with file, line, column, field path and
//! hint, printed the way a compiler prints them.

use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        })
    }
}

/// A problem found in the policy files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Diagnostic {
    pub severity: Severity,
    /// Display path of the file, relative to the policy root, `/`-separated.
    pub file: String,
    /// 1-based; 0 when the problem concerns the whole file.
    pub line: u32,
    /// 1-based, in characters; 0 when unknown.
    pub column: u32,
    /// Where in the policy: `Team/vision.spec.quotas.H100.guaranteed`, or
    /// `document 2` before the document's kind and name are known.
    pub path: String,
    pub message: String,
    pub hint: Option<String>,
    /// The text of `line`, for the caret display.
    pub source_line: Option<String>,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The order diagnostics are reported in: by file, line, column, then text.
    pub(crate) fn sort_key(&self) -> (&str, u32, u32, Severity, &str, &str) {
        (
            &self.file,
            self.line,
            self.column,
            self.severity,
            &self.path,
            &self.message,
        )
    }
}

/// ```text
/// error: guaranteed (20) exceeds limit (16)
///   --> teams/vision.yaml:7:19
///    |
///  7 |       guaranteed: 20
///    |                   ^
///    = field: Team/vision.spec.quotas.H100
///    = hint: raise limit or lower guaranteed
/// ```
impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}: {}", self.severity, self.message)?;
        let line_no = self.line.to_string();
        let pad = " ".repeat(line_no.len());
        match (self.line, self.column) {
            (0, _) => writeln!(f, "{pad}--> {}", self.file)?,
            (l, 0) => writeln!(f, "{pad}--> {}:{l}", self.file)?,
            (l, c) => writeln!(f, "{pad}--> {}:{l}:{c}", self.file)?,
        }
        if let (Some(src), true) = (&self.source_line, self.line > 0) {
            writeln!(f, "{pad} |")?;
            writeln!(f, "{line_no} | {src}")?;
            if self.column > 0 {
                // Keep tabs so the caret lines up under the same column.
                let lead: String = src
                    .chars()
                    .take(self.column as usize - 1)
                    .map(|c| if c == '\t' { '\t' } else { ' ' })
                    .collect();
                writeln!(f, "{pad} | {lead}^")?;
            }
        }
        if !self.path.is_empty() {
            writeln!(f, "{pad} = field: {}", self.path)?;
        }
        if let Some(hint) = &self.hint {
            writeln!(f, "{pad} = hint: {hint}")?;
        }
        Ok(())
    }
}

/// `3 errors, 1 warning`.
pub fn count_summary(errors: usize, warnings: usize) -> String {
    fn plural(n: usize, word: &str) -> String {
        if n == 1 {
            format!("1 {word}")
        } else {
            format!("{n} {word}s")
        }
    }
    format!(
        "{}, {}",
        plural(errors, "error"),
        plural(warnings, "warning")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_like_a_compiler() {
        let d = Diagnostic {
            severity: Severity::Error,
            file: "teams/vision.yaml".into(),
            line: 7,
            column: 19,
            path: "Team/vision.spec.quotas.H100.guaranteed".into(),
            message: "guaranteed (20) exceeds limit (16)".into(),
            hint: Some("raise limit or lower guaranteed".into()),
            source_line: Some("      guaranteed: 20".into()),
        };
        let s = d.to_string();
        assert!(s.starts_with("error: guaranteed (20) exceeds limit (16)\n"));
        assert!(s.contains(" --> teams/vision.yaml:7:19\n"));
        assert!(s.contains("7 |       guaranteed: 20\n"));
        assert!(s.contains("  |                   ^\n"));
        assert!(s.contains("= field: Team/vision.spec.quotas.H100.guaranteed"));
        assert!(s.contains("= hint: raise limit or lower guaranteed"));
        assert_eq!(count_summary(1, 0), "1 error, 0 warnings");
    }
}
