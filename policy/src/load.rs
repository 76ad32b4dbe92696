//! Loading, the entry points: reads policy files from a directory tree
//! (`walk.rs`) or from memory, parses every document (`document.rs`),
//! validates them together (`validate.rs`) and returns a [`Policy`] only when
//! there is no error at all.

use std::path::Path;

use thiserror::Error;

use crate::diag::{Diagnostic, Severity, count_summary};
use crate::document::{Docs, parse_document, split_documents};
use crate::model::Policy;
use crate::report::{Reporter, Source};
use crate::revision::revision_of;
use crate::validate;
use crate::walk::walk;

/// A policy that loaded without errors, and the warnings found on the way.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub policy: Policy,
    pub warnings: Vec<Diagnostic>,
}

/// Why a policy did not load: every error found, in file/line/column order.
#[derive(Debug, Clone, Error)]
#[error("{}", render_failure(.errors, .warnings))]
pub struct LoadFailure {
    pub errors: Vec<Diagnostic>,
    pub warnings: Vec<Diagnostic>,
}

fn render_failure(errors: &[Diagnostic], warnings: &[Diagnostic]) -> String {
    let mut out = String::new();
    for d in errors.iter().chain(warnings) {
        out.push_str(&d.to_string());
        out.push('\n');
    }
    out.push_str("policy invalid: ");
    out.push_str(&count_summary(errors.len(), warnings.len()));
    out
}

/// Loads every `*.yaml` / `*.yml` file under `dir` (recursively, in sorted
/// path order, skipping hidden files and directories such as `.git`).
pub fn load_dir(dir: &Path) -> Result<Loaded, LoadFailure> {
    let mut sources = Vec::new();
    let mut problems = Vec::new();
    walk(dir, "", 0, &mut sources, &mut problems);
    sources.sort_by(|a, b| a.0.cmp(&b.0));
    problems.sort_by(|a: &Diagnostic, b| a.sort_key().cmp(&b.sort_key()));
    let root = dir.display().to_string();
    if sources.is_empty() && problems.is_empty() {
        problems.push(Diagnostic {
            // An error, not a warning: a policy without teams admits no
            // workload, and an empty directory is nearly always a wrong path.
            severity: Severity::Error,
            file: root,
            line: 0,
            column: 0,
            path: String::new(),
            message: "no policy files (*.yaml, *.yml) found".to_string(),
            hint: Some(
                "a policy needs at least one Team document; see `axle policy schema`".to_string(),
            ),
            source_line: None,
        });
    }
    let (errors, warnings): (Vec<_>, Vec<_>) = problems.into_iter().partition(|d| d.is_error());
    match load_sources(&sources) {
        Ok(mut loaded) if errors.is_empty() => {
            loaded.warnings.extend(warnings);
            sort(&mut loaded.warnings);
            Ok(loaded)
        }
        Ok(loaded) => {
            let mut w = warnings;
            w.extend(loaded.warnings);
            sort(&mut w);
            Err(LoadFailure {
                errors,
                warnings: w,
            })
        }
        Err(mut failure) => {
            failure.errors.extend(errors);
            failure.warnings.extend(warnings);
            sort(&mut failure.errors);
            sort(&mut failure.warnings);
            Err(failure)
        }
    }
}

fn sort(diags: &mut [Diagnostic]) {
    diags.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
}

/// Loads policy documents from `(display path, content)` pairs, as read from a
/// directory or a Git tree. Processed in path order whatever the input order.
pub fn load_sources(sources: &[(String, String)]) -> Result<Loaded, LoadFailure> {
    let mut sorted: Vec<&(String, String)> = sources.iter().collect();
    sorted.sort_by(|a, b| a.0.cmp(&b.0));
    let revision = revision_of(&sorted);
    let srcs: Vec<Source> = sorted
        .iter()
        .map(|(path, text)| Source::new(path, text))
        .collect();
    let mut rep = Reporter {
        sources: &srcs,
        diags: Vec::new(),
    };
    let mut docs = Docs::default();
    for (file, src) in srcs.iter().enumerate() {
        for (index, chunk) in split_documents(src.text).into_iter().enumerate() {
            parse_document(&mut rep, &mut docs, file, index + 1, chunk);
        }
    }
    let policy = validate::validate(docs, &mut rep, revision);
    let mut diags = rep.diags;
    sort(&mut diags);
    let (errors, warnings): (Vec<_>, Vec<_>) = diags.into_iter().partition(|d| d.is_error());
    if errors.is_empty() {
        Ok(Loaded { policy, warnings })
    } else {
        Err(LoadFailure { errors, warnings })
    }
}
