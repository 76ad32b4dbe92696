//! The directory walk: every `*.yaml` / `*.yml` file under a policy root, in
//! sorted path order, skipping hidden entries (such as `.git`), with a
//! diagnostic for each file that cannot be read and limits on depth, size
//! and count.

use std::fs;
use std::path::Path;

use crate::diag::{Diagnostic, Severity};

/// Deeper trees are almost certainly a symlink loop; real policy repos nest
/// two or three levels (`teams/<org>/<team>.yaml`).
const MAX_DIR_DEPTH: usize = 16;
/// A policy file is a few KiB; anything this large is a mistake (a binary or a
/// generated dump), and parsing it would only produce noise.
const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;
/// Bounds the work and the memory of one load; a thousand teams with a file
/// each plus clusters and providers stays far below.
const MAX_FILES: usize = 10_000;

fn file_problem(file: String, message: String, hint: &str) -> Diagnostic {
    Diagnostic {
        severity: Severity::Error,
        file,
        line: 0,
        column: 0,
        path: String::new(),
        message,
        hint: Some(hint.to_string()),
        source_line: None,
    }
}

pub(crate) fn walk(
    dir: &Path,
    rel: &str,
    depth: usize,
    sources: &mut Vec<(String, String)>,
    problems: &mut Vec<Diagnostic>,
) {
    let shown = if rel.is_empty() {
        dir.display().to_string()
    } else {
        rel.to_string()
    };
    if depth > MAX_DIR_DEPTH {
        problems.push(file_problem(
            shown,
            format!("directory nesting deeper than {MAX_DIR_DEPTH} levels"),
            "check for a symlink loop",
        ));
        return;
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            problems.push(file_problem(
                shown,
                format!("cannot read directory: {e}"),
                "check that the path exists and is readable",
            ));
            return;
        }
    };
    let mut names: Vec<String> = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => match entry.file_name().into_string() {
                Ok(name) => names.push(name),
                Err(name) => problems.push(file_problem(
                    format!("{shown}/{}", name.to_string_lossy()),
                    "file name is not valid UTF-8".to_string(),
                    "rename the file",
                )),
            },
            Err(e) => problems.push(file_problem(
                shown.clone(),
                format!("cannot list directory: {e}"),
                "check permissions",
            )),
        }
    }
    names.sort();
    for name in names {
        if name.starts_with('.') {
            continue;
        }
        let path = dir.join(&name);
        let child_rel = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        // `metadata` follows symlinks, so a linked directory or file counts.
        let Ok(meta) = fs::metadata(&path) else {
            continue; // a dangling symlink: nothing to load
        };
        if meta.is_dir() {
            walk(&path, &child_rel, depth + 1, sources, problems);
        } else if meta.is_file() && (name.ends_with(".yaml") || name.ends_with(".yml")) {
            if sources.len() >= MAX_FILES {
                problems.push(file_problem(
                    child_rel,
                    format!("more than {MAX_FILES} policy files"),
                    "split the policy or remove stray YAML files",
                ));
                return;
            }
            if meta.len() > MAX_FILE_BYTES {
                problems.push(file_problem(
                    child_rel,
                    format!(
                        "file is {} bytes, more than the {MAX_FILE_BYTES} allowed",
                        meta.len()
                    ),
                    "policy files are small; is this a generated or binary file?",
                ));
                continue;
            }
            match fs::read(&path) {
                Ok(bytes) => match String::from_utf8(bytes) {
                    Ok(text) => sources.push((child_rel, text)),
                    Err(_) => problems.push(file_problem(
                        child_rel,
                        "file is not valid UTF-8".to_string(),
                        "save the file as UTF-8",
                    )),
                },
                Err(e) => problems.push(file_problem(
                    child_rel,
                    format!("cannot read file: {e}"),
                    "check permissions",
                )),
            }
        }
    }
}
