//! CSV plumbing for the trace and node-list parsers: `csv` crate records with
//! physical line numbers, strict quoting, header checks and trimmed cells.

use csv::StringRecord;

use super::TraceError;

/// A header column a format knows about.
pub(super) struct Column {
    name: &'static str,
    kind: ColumnKind,
}

#[derive(PartialEq)]
enum ColumnKind {
    /// Must be present.
    Required,
    /// Used when present.
    Optional,
    /// Part of the format but not read; accepted when present.
    Ignored,
}

impl Column {
    pub(super) const fn required(name: &'static str) -> Column {
        Column {
            name,
            kind: ColumnKind::Required,
        }
    }

    pub(super) const fn optional(name: &'static str) -> Column {
        Column {
            name,
            kind: ColumnKind::Optional,
        }
    }

    pub(super) const fn ignored(name: &'static str) -> Column {
        Column {
            name,
            kind: ColumnKind::Ignored,
        }
    }
}

/// Yields the non-blank records of a file with the 1-based line each starts on.
pub(super) struct Reader<'a> {
    file: &'a str,
    /// The content without its BOM; `csv` reads exactly these bytes, so its
    /// byte offsets index this string.
    content: &'a str,
    csv: csv::Reader<&'a [u8]>,
    /// Reused for every record, so reading allocates only when a record is
    /// longer than any before it.
    record: StringRecord,
    /// The line the record in `record` starts on.
    line: u64,
}

impl<'a> Reader<'a> {
    pub(super) fn new(file: &'a str, content: &'a str) -> Reader<'a> {
        let content = content.strip_prefix('\u{feff}').unwrap_or(content);
        let csv = csv::ReaderBuilder::new()
            // The header is read as an ordinary record, so that blank lines
            // before it, its quoting and its line number are handled like a
            // row's.
            .has_headers(false)
            // Field counts are checked here, to name the header in the message.
            .flexible(true)
            // Records end at LF only, as lines do: the default also ends them
            // at a lone CR, which `csv` does not count as a line, so errors
            // after one would name the wrong line. The CR of a CRLF stays on
            // the last cell and is trimmed with it.
            .terminator(csv::Terminator::Any(b'\n'))
            // Not `Trim::All`: csv 1.4 rebuilds every trimmed record in fresh
            // buffers (about seven allocations a row), which defeats reusing
            // `record`. Cells are trimmed with the same `str::trim` on access.
            .trim(csv::Trim::None)
            .from_reader(content.as_bytes());
        Reader {
            file,
            content,
            csv,
            record: StringRecord::new(),
            line: 1,
        }
    }

    fn error(&self, line: u64, message: String) -> TraceError {
        TraceError {
            file: self.file.to_string(),
            line,
            message,
        }
    }

    /// Reads the next record that is not blank into `self.record` and returns
    /// its raw text (terminator included, if any); `None` at the end.
    fn advance(&mut self) -> Result<Option<&'a str>, TraceError> {
        loop {
            let read = self.csv.read_record(&mut self.record);
            let position = self
                .record
                .position()
                .unwrap_or(self.csv.position())
                .clone();
            let (start, line) = physical_start(self.content, &position);
            self.line = line;
            match read {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                // Neither I/O nor UTF-8 can fail on a `&str`; kept total anyway.
                Err(error) => return Err(self.error(line, format!("unreadable CSV: {error}"))),
            }
            let end = usize::try_from(self.csv.position().byte())
                .unwrap_or(usize::MAX)
                .min(self.content.len());
            let raw = self.content.get(start..end).unwrap_or("");
            if raw.contains('"') {
                check_quotes(raw).map_err(|message| self.error(line, message))?;
            }
            // `csv` skips empty lines itself, but a line of spaces (or just the
            // CR of a CRLF) is a record.
            if !raw.trim().is_empty() {
                return Ok(Some(raw));
            }
        }
    }

    /// Reads the header line and checks that every required column is there
    /// and none is named twice.
    pub(super) fn header(
        &mut self,
        columns: &[Column],
        expected: &str,
    ) -> Result<Header, TraceError> {
        let Some(raw) = self.advance()? else {
            return Err(self.error(
                1,
                format!("empty file; expected a header line with columns {expected}"),
            ));
        };
        let names: Vec<String> = self
            .record
            .iter()
            .map(|name| name.trim().to_string())
            .collect();
        let missing: Vec<&str> = columns
            .iter()
            .filter(|column| column.kind == ColumnKind::Required)
            .map(|column| column.name)
            .filter(|name| !names.iter().any(|have| have == name))
            .collect();
        if !missing.is_empty() {
            let known = names
                .iter()
                .any(|name| columns.iter().any(|column| column.name == name));
            let message = if known {
                format!(
                    "header lacks column(s) {}; expected columns {expected}",
                    missing.join(",")
                )
            } else {
                let line = raw.trim_end_matches(['\r', '\n']);
                format!("missing or wrong header `{line}`; expected columns {expected}")
            };
            return Err(self.error(self.line, message));
        }
        for (index, name) in names.iter().enumerate() {
            if names[..index].contains(name) {
                return Err(self.error(
                    self.line,
                    format!("duplicate column `{name}` in the header"),
                ));
            }
        }
        Ok(Header {
            file: self.file.to_string(),
            line: self.line,
            names,
        })
    }

    /// The next data row, checked to have as many fields as the header.
    pub(super) fn next_row(&mut self, header: &Header) -> Result<Option<Row<'_>>, TraceError> {
        if self.advance()?.is_none() {
            return Ok(None);
        }
        if self.record.len() != header.names.len() {
            return Err(self.error(
                self.line,
                format!(
                    "expected {} fields as in the header ({}), found {}",
                    header.names.len(),
                    header.names.join(","),
                    self.record.len()
                ),
            ));
        }
        Ok(Some(Row {
            file: self.file,
            line: self.line,
            record: &self.record,
        }))
    }
}

/// Where a record really starts: its byte offset in `content` and its 1-based
/// line. `csv` stamps a record with the reader's position *before* the empty
/// lines that it skips on the way to it, so those are stepped over here.
fn physical_start(content: &str, position: &csv::Position) -> (usize, u64) {
    let from = usize::try_from(position.byte())
        .unwrap_or(usize::MAX)
        .min(content.len());
    let empty_lines = content.as_bytes()[from..]
        .iter()
        .take_while(|&&byte| byte == b'\n')
        .count();
    (from + empty_lines, position.line() + empty_lines as u64)
}

/// Checks the quoting of one record's raw text (through its LF, if any).
///
/// `csv` never fails on quotes: a quoted field runs on across line breaks to
/// the next quote or to the end of the input, and text after a closing quote is
/// appended to the field. No trace field holds a line break, so a quote that
/// does not close on its own line is a lost closing quote, which would silently
/// merge the rows up to the next stray quote into one field; it is an error
/// here, as is text after a closing quote.
fn check_quotes(raw: &str) -> Result<(), String> {
    // Only ASCII bytes are looked at, and fields are split where `csv` splits
    // them: a quote opens a quoted field only as a field's first byte.
    let bytes = raw.as_bytes();
    let mut at = 0;
    let mut field = 1;
    loop {
        if bytes.get(at) == Some(&b'"') {
            at += 1;
            loop {
                let closing = bytes[at..]
                    .iter()
                    .position(|&byte| matches!(byte, b'"' | b'\n'))
                    .filter(|&offset| bytes[at + offset] == b'"');
                let Some(offset) = closing else {
                    return Err(format!("field {field}: quoted field has no closing quote"));
                };
                at += offset + 1;
                if bytes.get(at) == Some(&b'"') {
                    at += 1;
                } else {
                    break;
                }
            }
            match bytes.get(at) {
                Some(b',') => {}
                None | Some(b'\n') => return Ok(()),
                Some(b'\r') if matches!(bytes.get(at + 1), None | Some(b'\n')) => return Ok(()),
                Some(_) => {
                    return Err(format!(
                        "field {field}: unexpected text after the closing quote"
                    ));
                }
            }
        } else {
            match bytes[at..].iter().position(|&byte| byte == b',') {
                Some(offset) => at += offset,
                None => return Ok(()),
            }
        }
        // `at` is on the comma that ends field `field`.
        at += 1;
        field += 1;
    }
}

pub(super) struct Header {
    file: String,
    line: u64,
    names: Vec<String>,
}

impl Header {
    /// The field index of a column, if the header has it.
    pub(super) fn position(&self, column: &str) -> Option<usize> {
        self.names.iter().position(|name| name == column)
    }

    /// The field index of a required column (checked by [`Reader::header`]).
    pub(super) fn index(&self, column: &str) -> Result<usize, TraceError> {
        self.position(column).ok_or_else(|| TraceError {
            file: self.file.clone(),
            line: self.line,
            message: format!("header lacks column {column}"),
        })
    }

    /// Fails when the header has columns that are not in `columns`.
    pub(super) fn reject_unknown(&self, columns: &[Column]) -> Result<(), TraceError> {
        let unknown: Vec<&str> = self
            .names
            .iter()
            .map(String::as_str)
            .filter(|name| !columns.iter().any(|column| column.name == *name))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let required: Vec<&str> = columns
            .iter()
            .filter(|column| column.kind == ColumnKind::Required)
            .map(|column| column.name)
            .collect();
        let optional: Vec<&str> = columns
            .iter()
            .filter(|column| column.kind != ColumnKind::Required)
            .map(|column| column.name)
            .collect();
        let quoted: Vec<String> = unknown.iter().map(|name| format!("`{name}`")).collect();
        Err(TraceError {
            file: self.file.clone(),
            line: self.line,
            message: format!(
                "unknown column(s) {}; expected {} and optionally {}",
                quoted.join(", "),
                required.join(","),
                optional.join(",")
            ),
        })
    }
}

/// One data row; cells are trimmed.
pub(super) struct Row<'r> {
    file: &'r str,
    line: u64,
    record: &'r StringRecord,
}

impl Row<'_> {
    /// The line the row starts on.
    pub(super) fn line(&self) -> u64 {
        self.line
    }

    pub(super) fn cell(&self, index: usize) -> &str {
        self.record.get(index).map_or("", str::trim)
    }

    pub(super) fn error(&self, message: String) -> TraceError {
        TraceError {
            file: self.file.to_string(),
            line: self.line,
            message,
        }
    }

    pub(super) fn column_error(&self, column: &str, message: String) -> TraceError {
        self.error(format!("column `{column}`: {message}"))
    }

    /// Parses the cell at `index`, naming `column` in any error.
    pub(super) fn get<T>(
        &self,
        index: usize,
        column: &str,
        parse: impl FnOnce(&str) -> Result<T, String>,
    ) -> Result<T, TraceError> {
        parse(self.cell(index)).map_err(|message| self.column_error(column, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields the reader makes of one line (cells trimmed, as rows give
    /// them), or its quoting error.
    fn split_fields(line: &str, out: &mut Vec<String>) -> Result<(), String> {
        out.clear();
        let mut reader = Reader::new("t", line);
        if reader.advance().map_err(|error| error.message)?.is_some() {
            out.extend(reader.record.iter().map(|field| field.trim().to_string()));
        }
        Ok(())
    }

    /// Every record of `content` as `(line, fields)`, or the first error.
    fn records(content: &str) -> Result<Vec<(u64, Vec<String>)>, TraceError> {
        let mut reader = Reader::new("t.csv", content);
        let mut out = Vec::new();
        while reader.advance()?.is_some() {
            let fields = reader.record.iter().map(|f| f.trim().to_string()).collect();
            out.push((reader.line, fields));
        }
        Ok(out)
    }

    #[test]
    fn split_fields_handles_quotes() {
        let mut out = Vec::new();
        split_fields("a,\"b,c\",\"\"\"", &mut out).unwrap_err();
        split_fields(r#"a,"b,c","say ""hi""",,"""",x"#, &mut out).unwrap();
        assert_eq!(out, ["a", "b,c", r#"say "hi""#, "", "\"", "x"]);
        split_fields(r#""",a,"#, &mut out).unwrap();
        assert_eq!(out, ["", "a", ""]);
        split_fields(r#"x"y,z"#, &mut out).unwrap();
        assert_eq!(out, [r#"x"y"#, "z"]);
    }

    #[test]
    fn lines_are_physical_across_blank_lines_crlf_and_bom() {
        let content = "\u{feff}\r\n\nh1, h2 \r\na,b\r\n\r\n  \t \n\nc , d\n\r\ne,f";
        let lines: Vec<(u64, Vec<String>)> = records(content).unwrap();
        let expected = [
            (3, ["h1", "h2"]),
            (4, ["a", "b"]),
            (8, ["c", "d"]),
            (10, ["e", "f"]),
        ];
        assert_eq!(lines.len(), expected.len());
        for ((line, fields), (want_line, want_fields)) in lines.iter().zip(expected) {
            assert_eq!(
                (*line, fields[..].to_vec()),
                (want_line, want_fields.map(String::from).to_vec())
            );
        }
        assert_eq!(records("").unwrap(), []);
        assert_eq!(records("\n\r\n \n").unwrap(), []);
    }

    #[test]
    fn a_lone_cr_is_not_a_line_break() {
        let lines = records("h,i\na\rb,c\r\n\"d\"\r\ne,\"f\"\r\n").unwrap();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[1], (2, vec!["a\rb".to_string(), "c".to_string()]));
        let error = records("h,i\na\rb,c\n\"d\"\re,f\n").unwrap_err();
        assert_eq!(error.line, 3);
        assert!(
            error
                .message
                .contains("field 1: unexpected text after the closing quote")
        );
    }

    #[test]
    fn a_quoted_field_must_close_on_its_line() {
        // Where `csv` would take the rows up to the next quote as one field.
        for content in ["h,i\n\"a\nb\",c\nd,e\n", "h,i\n1,\"2\n3,\"4\"\n5,6\n"] {
            let error = records(content).unwrap_err();
            assert_eq!(error.line, 2);
            assert!(error.message.contains("quoted field has no closing quote"));
        }
        let lines = records("h,i\n\"a\rb\",c\n").unwrap();
        assert_eq!(lines[1], (2, vec!["a\rb".to_string(), "c".to_string()]));
    }

    #[test]
    fn quoting_errors_name_the_line_the_record_starts_on() {
        let error = records("h,i\n\n1,2\n3,\"4\n5,6\n").unwrap_err();
        assert_eq!((error.line, error.file.as_str()), (4, "t.csv"));
        assert!(
            error
                .message
                .contains("field 2: quoted field has no closing quote")
        );
        let error = records("h,i\r\n\"1\" ,2\r\n").unwrap_err();
        assert_eq!(error.line, 2);
        assert!(
            error
                .message
                .contains("field 1: unexpected text after the closing quote")
        );
        // A closing quote right before the line ending is fine with CR or LF.
        assert_eq!(records("\"h\"\r\n\"a\"\n").unwrap().len(), 2);
    }

    #[test]
    fn check_quotes_follows_the_csv_crate_field_split() {
        assert_eq!(check_quotes("a,\"b\"\"\",c\r"), Ok(()));
        assert_eq!(check_quotes("a\"b,\"c\""), Ok(()));
        assert_eq!(check_quotes(" \"a,b"), Ok(()));
        assert!(check_quotes("\"a\"b").is_err());
        assert!(check_quotes("a,\"").is_err());
        assert!(check_quotes("a,\"\"\"").is_err());
        assert!(check_quotes("\"a\n\"").is_err());
        assert!(check_quotes("\"a\"\r,b").is_err());
    }
}
