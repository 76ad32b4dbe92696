//! kubectl-style text tables, laid out by comfy-table: no borders, columns
//! three spaces apart, every cell on one line (control characters shown
//! escaped), no trailing spaces, and the last column cut with '…' to fit a
//! terminal's width. Widths are display widths (`é` and `…` are one column,
//! a CJK character two). A watch (`get -w`) prints a line at a time on
//! widths it keeps across polls ([`line`], [`grow`]).

use comfy_table::{
    ColumnConstraint, ContentArrangement, Row as TableRow, Table, TableStyle, Width,
};

use crate::table::{Row, printable};

/// Spaces between columns (kubectl uses 3).
pub const COLUMN_GAP: usize = 3;

/// Narrowest the last column is cut to when fitting a terminal: a reason
/// cut shorter than this says nothing.
pub const MIN_LAST_COLUMN_CHARS: usize = 20;

/// Widest a column may be laid out (comfy-table counts in `u16`); wider
/// cells are cut with '…'.
const MAX_COLUMN_WIDTH: usize = u16::MAX as usize - COLUMN_GAP;

/// A header (when `header` is given) and `rows`, each line ending in '\n';
/// each column as wide as its widest cell, the last one cut so that every
/// line fits `max_line` characters when given.
pub fn render(header: Option<&[&str]>, rows: &[Row], max_line: Option<usize>) -> String {
    let cells: Vec<&[String]> = rows.iter().map(|r| r.cells.as_slice()).collect();
    let mut out = String::new();
    for l in build(header, &cells, None, max_line).lines() {
        out.push_str(l.trim_end());
        out.push('\n');
    }
    out
}

/// One line of cells laid out on `widths` (every column but the last
/// exactly that wide, 3 spaces apart; a cell wider than its column is cut
/// with '…'), the last cell cut so the line fits `max_line` characters when
/// given, never below [`MIN_LAST_COLUMN_CHARS`]. No trailing spaces, no
/// newline.
pub fn line<S: AsRef<str>>(cells: &[S], widths: &[usize], max_line: Option<usize>) -> String {
    let cells: Vec<String> = cells.iter().map(|c| c.as_ref().to_string()).collect();
    build(None, &[cells.as_slice()], Some(widths), max_line)
        .lines()
        .next()
        .map(|l| l.trim_end().to_string())
        .unwrap_or_default()
}

/// Widens `widths` so that `rows` fit; whether any column widened.
pub fn grow<S: AsRef<str>>(widths: &mut Vec<usize>, rows: &[Vec<S>]) -> bool {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| c.as_ref().to_string()).collect())
        .collect();
    let slices: Vec<&[String]> = cells.iter().map(Vec::as_slice).collect();
    let needed = measure(&slices);
    if widths.len() < needed.len() {
        widths.resize(needed.len(), 0);
    }
    let mut widened = false;
    for (w, n) in widths.iter_mut().zip(needed) {
        if n > *w {
            *w = n;
            widened = true;
        }
    }
    widened
}

/// Each column's widest cell, as comfy-table measures it.
fn measure(rows: &[&[String]]) -> Vec<usize> {
    let mut t = Table::new();
    for r in rows {
        t.add_row(r.iter().map(|c| printable(c).into_owned()));
    }
    t.column_max_content_widths()
        .into_iter()
        .map(usize::from)
        .collect()
}

/// The comfy-table table: borderless, every column but the last `widths`
/// wide (default: its widest cell) plus the gap, the last one unpadded and
/// bounded by `max_line`.
fn build(
    header: Option<&[&str]>,
    rows: &[&[String]],
    widths: Option<&[usize]>,
    max_line: Option<usize>,
) -> Table {
    let one_line = |cells: Vec<String>| {
        let mut row = TableRow::from(cells);
        row.max_height(1);
        row
    };
    let mut t = Table::new();
    t.load_style(TableStyle::new())
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_truncation_indicator("…");
    if let Some(h) = header {
        t.set_header(one_line(
            h.iter().map(|c| printable(c).into_owned()).collect(),
        ));
    }
    for r in rows {
        t.add_row(one_line(
            r.iter().map(|c| printable(c).into_owned()).collect(),
        ));
    }
    let measured: Vec<usize>;
    let widths = match widths {
        Some(w) => w,
        None => {
            measured = t
                .column_max_content_widths()
                .into_iter()
                .map(usize::from)
                .collect();
            &measured
        }
    };
    let n = t.column_count();
    let used: usize = (0..n.saturating_sub(1))
        .map(|i| widths.get(i).copied().unwrap_or(0).min(MAX_COLUMN_WIDTH) + COLUMN_GAP)
        .sum();
    for (i, col) in t.column_iter_mut().enumerate() {
        if i + 1 < n {
            let w = widths.get(i).copied().unwrap_or(0).min(MAX_COLUMN_WIDTH) + COLUMN_GAP;
            col.set_padding((0, COLUMN_GAP as u16));
            col.set_constraint(ColumnConstraint::Absolute(Width::Fixed(w as u16)));
        } else {
            col.set_padding((0, 0));
            if let Some(max) = max_line {
                let room = max
                    .saturating_sub(used)
                    .clamp(MIN_LAST_COLUMN_CHARS, MAX_COLUMN_WIDTH);
                col.set_constraint(ColumnConstraint::UpperBoundary(Width::Fixed(room as u16)));
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cells: &[&str]) -> Row {
        Row {
            key: cells[0].to_string(),
            cells: cells.iter().map(|c| c.to_string()).collect(),
        }
    }

    #[test]
    fn columns_are_three_spaces_apart_without_trailing_spaces() {
        let rows = [row(&["1", "long-name", ""]), row(&["12345", "n", "x"])];
        let out = render(Some(&["ID", "NAME", "REASON"]), &rows, None);
        assert_eq!(
            out,
            "ID      NAME        REASON\n1       long-name\n12345   n           x\n"
        );
        let bare = render(None, &rows, None);
        assert_eq!(bare, "1       long-name\n12345   n           x\n");
    }

    #[test]
    fn control_characters_are_shown_escaped_and_keep_the_columns() {
        let rows = vec![
            row(&["1", "red\u{1b}[31m\nnext", "#a"]),
            row(&["2", "plain", "#b"]),
        ];
        let out = render(Some(&["ID", "NAME", "#Z"]), &rows, None);
        assert!(!out.contains('\u{1b}'), "{out}");
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(out.contains("red\\u{1b}[31m\\nnext"), "{out}");
        let col = |l: &str| l.chars().position(|c| c == '#').unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(col(lines[0]), col(lines[1]));
        assert_eq!(col(lines[1]), col(lines[2]));
    }

    #[test]
    fn alignment_counts_display_columns_not_bytes() {
        let rows = vec![row(&["é…", "x"]), row(&["abc", "y"]), row(&["日本", "z"])];
        let out = render(Some(&["N", "V"]), &rows, None);
        assert_eq!(out, "N      V\né…     x\nabc    y\n日本   z\n");
    }

    #[test]
    fn the_last_column_is_cut_to_fit_the_terminal_but_not_below_the_floor() {
        let rows = [row(&["12", "Pending", &"y".repeat(100)])];
        let out = render(Some(&["ID", "STATE", "REASON"]), &rows, Some(50));
        let line = out.lines().nth(1).unwrap();
        assert_eq!(line.chars().count(), 50, "{line}");
        assert!(line.ends_with('…'), "{line}");
        let narrow = render(Some(&["ID", "STATE", "REASON"]), &rows, Some(10));
        let line = narrow.lines().nth(1).unwrap();
        assert_eq!(
            line.chars().count(),
            "12   Pending   ".len() + MIN_LAST_COLUMN_CHARS
        );
        // Words are cut where they end, when one does before the edge.
        let words = [row(&["12", "Pending", &"waiting for GPUs ".repeat(10)])];
        let out = render(Some(&["ID", "STATE", "REASON"]), &words, Some(50));
        let line = out.lines().nth(1).unwrap();
        assert!(line.chars().count() <= 50, "{line}");
        assert!(line.ends_with('…'), "{line}");
    }

    #[test]
    fn a_watch_line_fits_the_terminal_with_its_time_column() {
        let widths = [8, 3, 7, 6];
        let cells = ["12:00:01", "12", "Pending", &"x".repeat(200)];
        let line = line(&cells, &widths, Some(80));
        assert_eq!(line.chars().count(), 80, "{line}");
        assert!(line.starts_with("12:00:01   12    Pending   x"), "{line}");
        assert!(line.ends_with('…'));
    }

    #[test]
    fn a_watch_keeps_its_widths_until_a_wider_row_comes() {
        let mut widths = vec![2, 4];
        assert!(!grow(&mut widths, &[vec!["1", "ab"]]));
        assert_eq!(widths, [2, 4]);
        assert!(grow(&mut widths, &[vec!["1", "abcdef", "z"]]));
        assert_eq!(widths, [2, 6, 1]);
        assert_eq!(line(&["1", "ab", "z"], &widths, None), "1    ab       z");
    }
}
