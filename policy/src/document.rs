//! Document parsing: splits a file into YAML documents, reads each one's
//! header (`apiVersion`, `kind`, `metadata.name`) and then its typed spec,
//! so that one broken document does not hide the others.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::DeserializeOwned;

use crate::file::{
    API_VERSION, BurstProviderSpec, ClusterSpec, Header, Loc, PriorityClassSpec, SettingsSpec,
    SpecOnly, TeamSpec,
};
use crate::report::{Pos, Reporter};

/// The kinds of policy document.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Team,
    PriorityClass,
    Cluster,
    BurstProvider,
    Settings,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Team,
        Kind::PriorityClass,
        Kind::Cluster,
        Kind::BurstProvider,
        Kind::Settings,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Kind::Team => "Team",
            Kind::PriorityClass => "PriorityClass",
            Kind::Cluster => "Cluster",
            Kind::BurstProvider => "BurstProvider",
            Kind::Settings => "Settings",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A parsed document whose header was valid enough to read its spec.
pub(crate) struct Doc<S> {
    pub kind: Kind,
    pub name: String,
    /// Where `metadata.name` is.
    pub name_pos: Pos,
    /// Where `spec` starts.
    pub spec_pos: Pos,
    file: usize,
    /// Lines of the file before this document's first line.
    offset: u32,
    pub spec: S,
}

impl<S> Doc<S> {
    /// The absolute position of a value inside this document.
    pub fn at<T>(&self, loc: &Loc<T>) -> Pos {
        Pos {
            file: self.file,
            line: loc.line.saturating_add(self.offset),
            column: loc.column,
        }
    }

    /// `Team/vision.spec.quotas.H100` for `suffix` = `quotas.H100`.
    pub fn path(&self, suffix: &str) -> String {
        if suffix.is_empty() {
            format!("{}/{}.spec", self.kind, self.name)
        } else {
            format!("{}/{}.spec.{suffix}", self.kind, self.name)
        }
    }

    /// `Team/vision`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.kind, self.name)
    }
}

/// All documents that parsed, by kind, in file order; duplicates left out.
#[derive(Default)]
pub(crate) struct Docs {
    /// First position of each (kind, name), to report later duplicates.
    names: BTreeMap<(Kind, String), Pos>,
    pub teams: Vec<Doc<TeamSpec>>,
    pub priority_classes: Vec<Doc<PriorityClassSpec>>,
    pub clusters: Vec<Doc<ClusterSpec>>,
    pub burst_providers: Vec<Doc<BurstProviderSpec>>,
    pub settings: Vec<Doc<SettingsSpec>>,
}

/// One YAML document of a file: its text and how many lines precede it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk<'a> {
    pub text: &'a str,
    pub offset: u32,
    /// 1-based line of the first line with content (for "missing field" errors).
    pub first_line: u32,
}

fn is_separator(line: &str) -> bool {
    let line = line.trim_end();
    line == "---"
        || line
            .strip_prefix("---")
            .is_some_and(|rest| rest.starts_with([' ', '\t']))
}

fn is_blank(line: &str) -> bool {
    let t = line.trim();
    let t = t.strip_prefix("---").map_or(t, str::trim_start);
    t.is_empty() || t.starts_with('#') || t.starts_with('%') || t == "..."
}

/// Splits a file at `---` lines. A separator line stays at the head of the
/// document that follows it (it may carry content, as in `--- {a: 1}`), so
/// line numbers inside a chunk plus its offset are line numbers of the file.
/// Chunks with nothing but blanks and comments are dropped.
pub(crate) fn split_documents<'a>(text: &'a str) -> Vec<Chunk<'a>> {
    let mut chunks = Vec::new();
    let mut start_byte = 0usize;
    let mut start_line = 0u32;
    let mut first_content: Option<u32> = None;
    let mut pos = 0usize;
    let mut line_no = 0u32;
    let push = |chunks: &mut Vec<Chunk<'a>>, s: usize, e: usize, off: u32, fc: Option<u32>| {
        if let (Some(first_line), Some(text)) = (fc, text.get(s..e)) {
            chunks.push(Chunk {
                text,
                offset: off,
                first_line,
            });
        }
    };
    for line in text.split_inclusive('\n') {
        line_no = line_no.saturating_add(1);
        if is_separator(line) && line_no > 1 {
            push(&mut chunks, start_byte, pos, start_line, first_content);
            start_byte = pos;
            start_line = line_no - 1;
            first_content = None;
        }
        if first_content.is_none() && !is_blank(line) {
            first_content = Some(line_no);
        }
        pos += line.len();
    }
    push(
        &mut chunks,
        start_byte,
        text.len(),
        start_line,
        first_content,
    );
    chunks
}

/// Parser options: non-finite floats (`.nan`, `.inf`) reach the typed fields,
/// so that validation can name the field instead of failing the whole document.
fn yaml_options() -> serde_saphyr::Options {
    let mut options = serde_saphyr::Options::default();
    options.non_finite_float_policy = serde_saphyr::NonFiniteFloatPolicy::PassThrough;
    options
}

/// Turns a serde-saphyr error into (relative line, column, message without the
/// position suffix).
fn yaml_error_parts(e: &serde_saphyr::Error) -> (u32, u32, String) {
    let (line, column) = e.location().map_or((1, 1), |l| {
        (
            u32::try_from(l.line()).unwrap_or(u32::MAX),
            u32::try_from(l.column()).unwrap_or(u32::MAX),
        )
    });
    let mut msg = e.without_snippet().to_string();
    if let Some(i) = msg.rfind(" at line ") {
        let tail = &msg[i + " at line ".len()..];
        if tail
            .chars()
            .all(|c| c.is_ascii_digit() || c == ',' || c == ' ' || c.is_alphabetic())
        {
            msg.truncate(i);
        }
    }
    if let Some(i) = msg.find(", set DuplicateKeyPolicy") {
        msg.truncate(i);
    }
    (line, column, msg)
}

fn yaml_error_hint(msg: &str) -> &'static str {
    if msg.contains("unknown field") {
        "remove the field or fix its spelling; `axle policy schema` lists the allowed fields"
    } else if msg.contains("missing field") {
        "add the required field"
    } else if msg.contains("duplicate mapping key") {
        "each key may appear only once in a mapping"
    } else if msg.contains("unknown variant") {
        "use one of the listed values"
    } else if msg.contains("invalid") || msg.contains("expected") {
        "check the value's type against `axle policy schema`"
    } else {
        "fix the YAML syntax"
    }
}

fn report_yaml_error(
    rep: &mut Reporter<'_>,
    file: usize,
    chunk: &Chunk<'_>,
    path: String,
    e: &serde_saphyr::Error,
) {
    let (line, column, msg) = yaml_error_parts(e);
    let hint = yaml_error_hint(&msg);
    let pos = Pos {
        file,
        line: line.saturating_add(chunk.offset),
        column,
    };
    rep.error(pos, path, msg, hint);
}

pub(crate) fn parse_document(
    rep: &mut Reporter<'_>,
    docs: &mut Docs,
    file: usize,
    index: usize,
    chunk: Chunk<'_>,
) {
    let doc_path = format!("document {index}");
    let header: Header = match serde_saphyr::from_str_with_options(chunk.text, yaml_options()) {
        Ok(h) => h,
        Err(e) => {
            report_yaml_error(rep, file, &chunk, doc_path, &e);
            return;
        }
    };
    let rel = |loc_line: u32, column: u32| Pos {
        file,
        line: loc_line.saturating_add(chunk.offset),
        column,
    };
    let start = Pos {
        file,
        line: chunk.first_line,
        column: 1,
    };

    match &header.api_version {
        None => rep.error(
            start,
            doc_path.clone(),
            "missing apiVersion".to_string(),
            &format!("add `apiVersion: {API_VERSION}`"),
        ),
        Some(v) if v.value != API_VERSION => rep.error(
            rel(v.line, v.column),
            doc_path.clone(),
            format!("unsupported apiVersion `{}`", v.value),
            &format!("use `apiVersion: {API_VERSION}`"),
        ),
        Some(_) => {}
    }

    let kinds = Kind::ALL.map(Kind::as_str).join(", ");
    let kind = match &header.kind {
        None => {
            rep.error(
                start,
                doc_path,
                "missing kind".to_string(),
                &format!("add `kind:` with one of {kinds}"),
            );
            return;
        }
        Some(k) => match Kind::ALL.iter().find(|c| c.as_str() == k.value) {
            Some(kind) => *kind,
            None => {
                let near = Kind::ALL
                    .iter()
                    .find(|c| c.as_str().eq_ignore_ascii_case(&k.value));
                let hint = match near {
                    Some(c) => format!("did you mean `{c}`? kinds are case-sensitive"),
                    None => format!("use one of {kinds}"),
                };
                rep.error(
                    rel(k.line, k.column),
                    doc_path,
                    format!("unknown kind `{}`", k.value),
                    &hint,
                );
                return;
            }
        },
    };

    let (name, name_pos) = match &header.metadata {
        None => {
            rep.error(
                start,
                format!("{kind}/?"),
                "missing metadata".to_string(),
                "add `metadata:` with a `name:`",
            );
            return;
        }
        Some(meta) => match &meta.value.name {
            None => {
                rep.error(
                    rel(meta.line, meta.column),
                    format!("{kind}/?.metadata"),
                    "missing metadata.name".to_string(),
                    "add `name:` under `metadata:`",
                );
                return;
            }
            Some(name) => (name.value.clone(), rel(name.line, name.column)),
        },
    };
    if let Err(problem) = check_name(&name) {
        rep.error(
            name_pos,
            format!("{kind}/{name}.metadata.name"),
            format!("invalid name `{name}`: {problem}"),
            "names are DNS labels: lowercase letters, digits and `-`, starting and ending with a letter or digit, at most 63 characters",
        );
    }

    let Some(spec) = &header.spec else {
        rep.error(
            start,
            format!("{kind}/{name}"),
            "missing spec".to_string(),
            "add `spec:` (it may be `{}` where every field has a default)",
        );
        return;
    };
    let spec_pos = rel(spec.line, spec.column);
    // Settings are unique by kind, not by name (see `validate.rs`).
    let mut duplicate = false;
    if kind != Kind::Settings {
        if let Some(first) = docs.names.get(&(kind, name.clone())) {
            let hint = format!(
                "first defined at {}; names must be unique per kind",
                rep.describe(*first)
            );
            rep.error(
                name_pos,
                format!("{kind}/{name}.metadata.name"),
                format!("duplicate {kind} name `{name}`"),
                &hint,
            );
            duplicate = true;
        } else {
            docs.names.insert((kind, name.clone()), name_pos);
        }
    }
    let ctx = DocCtx {
        duplicate,
        kind,
        name,
        name_pos,
        spec_pos,
        file,
        chunk,
    };
    match kind {
        Kind::Team => push_spec(rep, &ctx, &mut docs.teams),
        Kind::PriorityClass => push_spec(rep, &ctx, &mut docs.priority_classes),
        Kind::Cluster => push_spec(rep, &ctx, &mut docs.clusters),
        Kind::BurstProvider => push_spec(rep, &ctx, &mut docs.burst_providers),
        Kind::Settings => push_spec(rep, &ctx, &mut docs.settings),
    }
}

struct DocCtx<'a> {
    kind: Kind,
    name: String,
    name_pos: Pos,
    spec_pos: Pos,
    file: usize,
    chunk: Chunk<'a>,
    duplicate: bool,
}

fn push_spec<S: DeserializeOwned>(rep: &mut Reporter<'_>, ctx: &DocCtx<'_>, out: &mut Vec<Doc<S>>) {
    match serde_saphyr::from_str_with_options::<SpecOnly<S>>(ctx.chunk.text, yaml_options()) {
        // A duplicate's spec is still parsed, to report its problems too.
        Ok(_) if ctx.duplicate => {}
        Ok(parsed) => out.push(Doc {
            kind: ctx.kind,
            name: ctx.name.clone(),
            name_pos: ctx.name_pos,
            spec_pos: ctx.spec_pos,
            file: ctx.file,
            offset: ctx.chunk.offset,
            spec: parsed.spec,
        }),
        Err(e) => {
            let path = format!("{}/{}.spec", ctx.kind, ctx.name);
            report_yaml_error(rep, ctx.file, &ctx.chunk, path, &e);
        }
    }
}

/// DNS-label rule for names: they appear in URLs, labels and metric labels.
pub(crate) fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("empty");
    }
    if name.len() > 63 {
        return Err("longer than 63 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err("only lowercase letters, digits and `-` are allowed");
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_at_separator_lines_and_keeps_offsets() {
        let text = "# head\na: 1\n---\nb: 2\n--- # c\n\n---\n# only comment\n---\nc: 3";
        let chunks = split_documents(text);
        let got: Vec<(u32, u32)> = chunks.iter().map(|c| (c.offset, c.first_line)).collect();
        assert_eq!(got, vec![(0, 2), (2, 4), (8, 10)]);
        assert!(chunks[1].text.starts_with("---\nb: 2"));
        assert_eq!(chunks[2].text, "---\nc: 3");
        let inline = split_documents("a: 1\n--- {b: 2}\n");
        assert_eq!(inline.len(), 2);
        assert_eq!(inline[1].first_line, 2);
    }

    #[test]
    fn leading_separator_is_part_of_first_document() {
        let chunks = split_documents("---\na: 1\n");
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].offset, 0);
        assert_eq!(chunks[0].first_line, 2);
    }

    #[test]
    fn names() {
        assert!(check_name("vision").is_ok());
        assert!(check_name("aws-us-east-1").is_ok());
        assert!(check_name("Vision").is_err());
        assert!(check_name("-a").is_err());
        assert!(check_name("a_b").is_err());
        assert!(check_name("").is_err());
        assert!(check_name(&"a".repeat(64)).is_err());
    }
}
