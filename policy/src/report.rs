//! Diagnostics plumbing: the source files of one load with their line
//! index, positions in them, and the `Reporter` that turns a position and a
//! message into a compiler-style [`Diagnostic`].

use crate::diag::{Diagnostic, Severity};

/// One input file with its line index for snippets.
pub(crate) struct Source<'a> {
    pub path: &'a str,
    pub text: &'a str,
    line_starts: Vec<usize>,
}

impl<'a> Source<'a> {
    pub(crate) fn new(path: &'a str, text: &'a str) -> Self {
        let mut line_starts = vec![0];
        line_starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Source {
            path,
            text,
            line_starts,
        }
    }

    fn line(&self, line: u32) -> Option<&'a str> {
        let idx = (line as usize).checked_sub(1)?;
        let start = *self.line_starts.get(idx)?;
        let end = self
            .line_starts
            .get(idx + 1)
            .map_or(self.text.len(), |e| e.saturating_sub(1));
        let s = self.text.get(start..end)?;
        Some(s.strip_suffix('\r').unwrap_or(s))
    }
}

/// An absolute position: source index, 1-based line and column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pos {
    pub file: usize,
    pub line: u32,
    pub column: u32,
}

/// Collects diagnostics, resolving positions to file names and source lines.
pub(crate) struct Reporter<'a> {
    pub sources: &'a [Source<'a>],
    pub diags: Vec<Diagnostic>,
}

impl Reporter<'_> {
    pub fn error(&mut self, pos: Pos, path: impl Into<String>, message: String, hint: &str) {
        self.push(Severity::Error, pos, path.into(), message, hint);
    }

    pub fn warning(&mut self, pos: Pos, path: impl Into<String>, message: String, hint: &str) {
        self.push(Severity::Warning, pos, path.into(), message, hint);
    }

    /// `teams/vision.yaml:7:19`, for messages that mention another place.
    pub fn describe(&self, pos: Pos) -> String {
        let file = self.sources.get(pos.file).map_or("?", |s| s.path);
        format!("{file}:{}:{}", pos.line, pos.column)
    }

    fn push(&mut self, severity: Severity, pos: Pos, path: String, message: String, hint: &str) {
        let src = self.sources.get(pos.file);
        self.diags.push(Diagnostic {
            severity,
            file: src.map_or_else(String::new, |s| s.path.to_string()),
            line: pos.line,
            column: pos.column,
            path,
            message,
            hint: (!hint.is_empty()).then(|| hint.to_string()),
            source_line: src.and_then(|s| s.line(pos.line)).map(str::to_string),
        });
    }
}
