//! Text from files and users, made safe to show in a terminal. A control character (escape, NUL,
//! carriage return, ...) or a bidirectional override could move the cursor, recolour, erase or
//! reorder what a terminal shows; such characters are refused in catalog text fields and escaped
//! (`\u{1b}`) wherever a value is echoed in a message.

use std::borrow::Cow;

/// Whether `c` must never reach a terminal raw: a control character (C0, DEL, C1) or a Unicode
/// bidirectional formatting character.
pub fn is_unsafe(c: char) -> bool {
    c.is_control() || is_bidi_control(c) || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}')
}

/// Whether `c` is one of the bidirectional embeddings, overrides and isolates that reorder how
/// the text around them is displayed.
pub fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// The first unsafe character of `s`, if any.
pub fn first_unsafe(s: &str) -> Option<char> {
    s.chars().find(|c| is_unsafe(*c))
}

/// The first string of a JSON document (a key or a value) holding an unsafe character: its JSON
/// pointer and the character.
pub fn first_unsafe_in_json(v: &serde_json::Value) -> Option<(String, char)> {
    use serde_json::Value;
    match v {
        Value::String(s) => first_unsafe(s).map(|c| (String::new(), c)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .find_map(|(i, x)| first_unsafe_in_json(x).map(|(p, c)| (format!("/{i}{p}"), c))),
        Value::Object(o) => o.iter().find_map(|(k, x)| {
            let key = first_unsafe(k).map(|c| (format!("/{}", printable(k)), c));
            key.or_else(|| first_unsafe_in_json(x).map(|(p, c)| (format!("/{k}{p}"), c)))
        }),
        _ => None,
    }
}

/// `s` with every unsafe character written as a Rust escape (`\u{1b}`, `\0` shown as `\u{0}`).
pub fn printable(s: &str) -> Cow<'_, str> {
    escape_except(s, |_| false)
}

/// Like [`printable`], but line breaks (`\n`) are kept: for multi-line messages.
pub fn printable_lines(s: &str) -> Cow<'_, str> {
    escape_except(s, |c| c == '\n')
}

fn escape_except(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) && !keep(c) {
            out.push_str(&format!("\\u{{{:x}}}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_obey() {
        assert_eq!(printable("NVIDIA H200"), "NVIDIA H200");
        assert_eq!(printable("a\u{1b}[31mb"), "a\\u{1b}[31mb");
        assert_eq!(printable("nul\0"), "nul\\u{0}");
        assert_eq!(printable("x\u{202e}y"), "x\\u{202e}y");
        assert_eq!(printable("c1\u{9b}2J"), "c1\\u{9b}2J");
        assert_eq!(printable("a\nb\r"), "a\\u{a}b\\u{d}");
        assert_eq!(printable_lines("a\nb\r"), "a\nb\\u{d}");
        assert_eq!(first_unsafe("ok\u{7f}"), Some('\u{7f}'));
        assert_eq!(first_unsafe("Grace Hopper GH200 — 96 GiB"), None);
    }
}
