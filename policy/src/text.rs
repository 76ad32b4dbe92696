//! Characters that no name may hold: control characters (a terminal obeys
//! them: colours, titles, clearing the screen) and the invisible format
//! characters that make one name look like another (bidirectional
//! overrides and isolates, zero-width spaces and joiners, a byte-order mark).
//! Names are shown to people in tables and events; `d2\u{200B}-victim` must
//! not pass for `d2-victim`.

/// The first character of `s` that a name may not hold, if any.
pub fn hidden_char(s: &str) -> Option<char> {
    s.chars().find(|&c| is_hidden(c))
}

/// A control character, or a format character that changes how text
/// around it is shown without being seen itself.
pub fn is_hidden(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'             // soft hyphen
            | '\u{061C}'           // Arabic letter mark
            | '\u{180E}'           // Mongolian vowel separator
            | '\u{200B}'..='\u{200F}' // zero-width space, joiners, LRM, RLM
            | '\u{2028}'..='\u{202E}' // line/paragraph separators, bidi embeddings and overrides
            | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
            | '\u{2066}'..='\u{206F}' // bidi isolates, deprecated format characters
            | '\u{FEFF}'           // byte-order mark, zero-width no-break space
            | '\u{FFF9}'..='\u{FFFB}' // interlinear annotations
        )
}

/// `s` safe to print on a terminal: every hidden character written as its
/// escape (`\n`, `\u{1b}`), so it is seen and never obeyed.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    if hidden_char(s).is_none() {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_hidden(c) {
            match c {
                '\n' => out.push_str("\\n"),
                '\t' => out.push_str("\\t"),
                '\r' => out.push_str("\\r"),
                c => out.push_str(&c.escape_unicode().to_string()),
            }
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Text for a terminal, lines kept: like [`printable`], but newlines and
/// tabs stay what they are (a multi-line description keeps its layout).
pub fn for_terminal(s: &str) -> std::borrow::Cow<'_, str> {
    if !s.chars().any(|c| is_hidden(c) && c != '\n' && c != '\t') {
        return std::borrow::Cow::Borrowed(s);
    }
    s.split('\n')
        .map(|line| {
            line.split('\t')
                .map(|part| printable(part).into_owned())
                .collect::<Vec<_>>()
                .join("\t")
        })
        .collect::<Vec<_>>()
        .join("\n")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookalikes_and_escapes_are_found() {
        assert_eq!(hidden_char("d2-victim"), None);
        assert_eq!(hidden_char("d2\u{200B}-victim"), Some('\u{200B}'));
        assert_eq!(hidden_char("abc\u{202E}gpj.exe"), Some('\u{202E}'));
        assert_eq!(hidden_char("\u{1b}]0;owned\u{7}"), Some('\u{1b}'));
        assert_eq!(hidden_char("名前-ü"), None);
        assert_eq!(printable("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(printable("x\u{202E}y\nz"), "x\\u{202e}y\\nz");
        assert_eq!(printable("plain"), "plain");
        assert_eq!(
            for_terminal("a\tb\nc\u{1b}]0;t\u{7}\n"),
            "a\tb\nc\\u{1b}]0;t\\u{7}\n"
        );
    }
}
