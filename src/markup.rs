//! Presentation primitives that every report shares: an HTML fragment, an SVG image, a table
//! whose rows are computed once and shown as aligned text or as captioned HTML, and label/value
//! rows rendered as text or as HTML from one list. A leaf: it knows no report, so `display` (the
//! reports' HTML) and `plot` (the charts) both build on it.

use html_escape::encode_text as esc;
use std::fmt;

/// An HTML fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Html(pub String);

/// An SVG image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Svg(pub String);

/// A report as label/value rows: the one list its text and HTML forms are both drawn from.
pub type Rows = Vec<(&'static str, String)>;

/// The fixed words a reader (or a check) relies on to tell a measurement from its absence: the
/// notebooks say them, and the GPU proof (`scripts/gpu/proof.py`) reads them from this file.
pub mod labels {
    /// Starts the message of a cell whose GPU could not be opened.
    pub const NO_GPU: &str = "No GPU: nothing measured.";
    /// Starts the message of a measurement that did not happen.
    pub const NO_MEASUREMENT: &str = "No measurement.";
    /// Marks figures shown from a file recorded on another machine.
    pub const RECORDED_ELSEWHERE: &str = "RECORDED ELSEWHERE";
}

fn emit(mime: &str, content: &str) {
    println!("EVCXR_BEGIN_CONTENT {mime}\n{content}\nEVCXR_END_CONTENT");
}

impl Html {
    /// Shows the fragment inline in a notebook (the evcxr kernel's rich output).
    pub fn evcxr_display(&self) {
        emit("text/html", &self.0);
    }
    /// A paragraph of text (escaped).
    pub fn note(text: &str) -> Html {
        Html(format!("<p>{}</p>", esc(text)))
    }
    /// Appends another fragment.
    pub fn then(mut self, more: Html) -> Html {
        self.0 += &more.0;
        self
    }
}

impl Svg {
    pub fn evcxr_display(&self) {
        emit("image/svg+xml", &self.0);
    }
    /// The image under a line of text, as one HTML output (a notebook shows one form per output).
    pub fn with_caption(&self, text: &str) -> Html {
        Html(format!("{}{}", Html::note(text).0, self.0))
    }
    /// The image as an HTML fragment.
    pub fn html(&self) -> Html {
        Html(self.0.clone())
    }
    /// Writes the SVG to a new file (never over an existing one).
    pub fn write_new(&self, path: &std::path::Path) -> Result<(), crate::files::WriteError> {
        crate::files::write_new_file(path, self.0.as_bytes())
    }
}

/// A table: a header and rows of cells, computed once, shown as aligned text (`Display`: text
/// columns left-aligned, the others right-aligned, each as wide as its widest cell or its minimum
/// width) or as a captioned HTML table ([`Table::html`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
    /// Minimum widths of the first columns in text (a layout readers already know).
    pub min_widths: Vec<usize>,
    /// Spaces between two columns in text.
    pub gap: usize,
    /// The columns aligned left in text (the first, by default).
    pub left: Vec<usize>,
}

impl Table {
    pub fn new(header: &[&str], rows: Vec<Vec<String>>) -> Table {
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            rows,
            min_widths: Vec::new(),
            gap: 1,
            left: vec![0],
        }
    }

    /// The same table with minimum column widths in text.
    pub fn with_min_widths(mut self, widths: &[usize]) -> Table {
        self.min_widths = widths.to_vec();
        self
    }

    /// The same table with `gap` spaces between columns in text.
    pub fn with_gap(mut self, gap: usize) -> Table {
        self.gap = gap;
        self
    }

    /// The same table with these columns aligned left in text.
    pub fn with_left(mut self, columns: &[usize]) -> Table {
        self.left = columns.to_vec();
        self
    }

    /// The table in HTML under `caption`; every cell is escaped.
    pub fn html(&self, caption: &str) -> Html {
        let header: Vec<&str> = self.header.iter().map(String::as_str).collect();
        table(caption, &header, &self.rows)
    }
}

impl fmt::Display for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let columns = self
            .rows
            .iter()
            .map(Vec::len)
            .chain([self.header.len()])
            .max()
            .unwrap_or(0);
        let mut widths: Vec<usize> = (0..columns)
            .map(|i| self.min_widths.get(i).copied().unwrap_or(0))
            .collect();
        for row in std::iter::once(&self.header).chain(&self.rows) {
            for (i, c) in row.iter().enumerate() {
                widths[i] = widths[i].max(c.chars().count());
            }
        }
        let gap = " ".repeat(self.gap);
        for row in std::iter::once(&self.header).chain(&self.rows) {
            let mut line = String::new();
            for (i, c) in row.iter().enumerate() {
                if i > 0 {
                    line += &gap;
                }
                if self.left.contains(&i) {
                    line += &format!("{c:<w$}", w = widths[i]);
                } else {
                    line += &format!("{c:>w$}", w = widths[i]);
                }
            }
            writeln!(f, "{}", line.trim_end())?;
        }
        Ok(())
    }
}

/// A captioned table; every cell is escaped.
pub fn table(caption: &str, header: &[&str], rows: &[Vec<String>]) -> Html {
    let mut h = format!(
        "<table><caption style=\"text-align:left\"><b>{}</b></caption><thead><tr>",
        esc(caption)
    );
    for c in header {
        h += &format!("<th>{}</th>", esc(c));
    }
    h += "</tr></thead><tbody>";
    for r in rows {
        h += "<tr>";
        for c in r {
            h += &format!("<td style=\"text-align:right\">{}</td>", esc(c));
        }
        h += "</tr>";
    }
    h += "</tbody></table>";
    Html(h)
}

/// Label/value rows as an HTML table under `caption`, with `footer` as a note below.
pub fn rows_html(caption: &str, rows: &Rows, footer: &str) -> Html {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(k, v)| vec![k.to_string(), v.clone()])
        .collect();
    table(caption, &["", ""], &cells).then(Html::note(footer))
}

/// Label/value rows as text: a title line, then one indented line per row with the labels in a
/// column `width` characters wide.
pub fn rows_text(
    f: &mut fmt::Formatter<'_>,
    title: &str,
    rows: &Rows,
    width: usize,
) -> fmt::Result {
    writeln!(f, "{title}")?;
    for (label, value) in rows {
        writeln!(f, "  {label:<width$} {value}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_table_aligns_its_columns() {
        let t = Table::new(&["name", "bytes"], vec![vec!["a".into(), "1 024".into()]]);
        assert_eq!(t.to_string(), "name bytes\na    1 024\n");
        let t = t.with_min_widths(&[6, 7]);
        assert_eq!(t.to_string(), "name     bytes\na        1 024\n");
    }

    #[test]
    fn cells_are_escaped() {
        let h = table("a<b", &["x&y"], &[vec!["<script>".into()]]);
        assert!(
            h.0.contains("a&lt;b") && h.0.contains("x&amp;y") && h.0.contains("&lt;script&gt;")
        );
    }
}
