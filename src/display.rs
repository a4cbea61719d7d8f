//! Rich display for notebooks: HTML tables and SVG charts that the evcxr kernel shows inline
//! (inherent `evcxr_display` methods), and that a program can print the same way.

use crate::catalog::{Catalog, CATALOG_COLUMNS};
use crate::environment::EnvironmentReport;
use crate::estimate::WeightEstimate;
use crate::grid::GridReport;
use crate::measure::{phase_cells, MeasureError, Measurement, PHASE_COLUMNS};
use crate::quote::Quote;
use html_escape::encode_text as esc;

/// An HTML fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Html(pub String);

/// An SVG image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Svg(pub String);

fn emit(mime: &str, content: &str) {
    println!("EVCXR_BEGIN_CONTENT {mime}\n{content}\nEVCXR_END_CONTENT");
}

impl Html {
    pub fn evcxr_display(&self) {
        emit("text/html", &self.0);
    }
    /// A paragraph of text (escaped).
    pub fn note(text: &str) -> Html {
        Html(format!("<p>{}</p>", esc(text)))
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
    /// Writes the SVG to a new file (never over an existing one).
    pub fn write_new(&self, path: &std::path::Path) -> Result<(), crate::files::WriteError> {
        crate::files::write_new_file(path, self.0.as_bytes())
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

fn pairs(caption: &str, rows: Vec<(&str, String)>, footer: &str) -> Html {
    let rows: Vec<Vec<String>> = rows.into_iter().map(|(k, v)| vec![k.into(), v]).collect();
    let mut h = table(caption, &["", ""], &rows);
    h.0 += &Html::note(footer).0;
    h
}

macro_rules! displayed {
    ($($t:ty),*) => {$(
        impl $t {
            /// Shows the HTML form inline in a notebook.
            pub fn evcxr_display(&self) {
                self.html().evcxr_display()
            }
        }
    )*};
}
displayed!(
    WeightEstimate,
    EnvironmentReport,
    Measurement,
    Quote,
    Catalog,
    GridReport
);

impl WeightEstimate {
    pub fn html(&self) -> Html {
        pairs(
            "Weight-memory estimate",
            vec![
                ("parameters", self.parameters.to_string()),
                (
                    "storage",
                    format!(
                        "{} bits → {} byte(s)",
                        self.bits_per_parameter, self.bytes_per_parameter
                    ),
                ),
                ("weights", self.weights.to_string()),
                ("reserve (your hypothesis)", self.reserve.to_string()),
                ("total", self.total.to_string()),
            ],
            &format!(
                "1 GiB = 2^30 bytes, 1 GB = 10^9 bytes; {}. Not included: {}. {}",
                self.rounding,
                self.not_included.join(", "),
                self.caveat
            ),
        )
    }
}

impl EnvironmentReport {
    pub fn html(&self) -> Html {
        let or = |v: &Option<String>| v.clone().unwrap_or_else(|| "—".into());
        let t = &self.libtorch;
        let mut rows = vec![
            ("tool", self.tool.clone()),
            ("built with", self.rust_version.clone()),
            (
                "libtorch",
                if let Some(e) = &t.load_error {
                    format!("not loadable: {e}")
                } else {
                    or(&t.version)
                },
            ),
            ("CUDA build of libtorch", or(&t.cuda_build)),
            ("CUDA runtime loaded", or(&t.cuda_runtime)),
            (
                "cuDNN build / loaded",
                format!("{} / {}", or(&t.cudnn_build), or(&t.cudnn_runtime)),
            ),
            ("CUDA available", self.cuda_available.to_string()),
            ("devices", self.device_count.to_string()),
        ];
        if let Some(d) = &self.device {
            rows.push(("device", format!("cuda:{} {}", d.index, d.name)));
            rows.push(("compute capability", d.compute_capability.clone()));
            rows.push(("total memory", d.total_memory.to_string()));
            rows.push((
                "runtime free / total",
                format!(
                    "{} / {}",
                    d.runtime_free.gib_text(),
                    d.runtime_total.gib_text()
                ),
            ));
        }
        if let Some(why) = &self.unavailable {
            rows.push(("GPU", format!("unavailable: {why}")));
        }
        rows.push((
            "driver (CUDA API)",
            or(&self.driver.cuda_driver_api_version),
        ));
        rows.push((
            "driver (kernel module)",
            or(&self.driver.kernel_module_version),
        ));
        pairs("Environment", rows, &self.notes.join(" "))
    }
}

impl Measurement {
    pub fn html(&self) -> Html {
        let c = &self.configuration;
        let caption = format!(
            "{} {} — [batch {}, context {}, width {}], hidden {}, {}, measured {}",
            c.device,
            self.gpu_name(),
            c.batch,
            c.context,
            c.width,
            c.hidden,
            c.dtype.name(),
            self.measured_at
        );
        let rows: Vec<Vec<String>> = self
            .phases
            .iter()
            .map(|p| phase_cells(p).to_vec())
            .collect();
        let mut h = table(&caption, &PHASE_COLUMNS, &rows);
        h.0 += &Html::note(&self.notes.join(" ")).0;
        h
    }

    /// The per-phase chart.
    pub fn chart(&self) -> Svg {
        crate::plot::phase_chart(self)
    }
}

impl Quote {
    pub fn html(&self) -> Html {
        let unit = match &self.unit_cost {
            None => "not computed (no accepted results given)".to_string(),
            Some(u) => format!(
                "USD {} per accepted result ({})",
                u.usd,
                if u.exact { "exact" } else { u.rounding }
            ),
        };
        pairs(
            "Package quote",
            vec![
                ("catalog", self.catalog.to_string()),
                ("model", format!("{} ({})", self.model, self.display_name)),
                ("duration", format!("{} days", self.duration_days)),
                (
                    "lots",
                    format!(
                        "{} × {} GPU(s) = {} GPU(s)",
                        self.lots, self.gpus_per_lot, self.total_gpus
                    ),
                ),
                ("lot price", self.lot_price_usd_cents.to_string()),
                ("total", self.total_usd_cents.to_string()),
                ("unit cost", unit),
            ],
            if self.catalog.illustrative {
                "ILLUSTRATIVE prices: stand-ins, not a real offer."
            } else {
                "Check the live offer before any purchase."
            },
        )
    }
}

impl Catalog {
    pub fn html(&self) -> Html {
        let rows: Vec<Vec<String>> = self.rows.iter().map(|r| r.cells().to_vec()).collect();
        table(&format!("Catalog {}", self.source), &CATALOG_COLUMNS, &rows)
    }
}

impl GridReport {
    pub fn html(&self) -> Html {
        let rows: Vec<Vec<String>> = self
            .problems
            .iter()
            .map(|p| vec![p.line.to_string(), p.column.clone(), p.message.clone()])
            .collect();
        if rows.is_empty() {
            return Html::note(&self.to_string());
        }
        table(
            &format!("{}: {} problem(s)", self.file, rows.len()),
            &["line", "column", "problem"],
            &rows,
        )
    }
}

/// One grid row as a two-column table (column, value).
pub fn grid_row(row: &[String]) -> Html {
    let rows: Vec<Vec<String>> = crate::grid::COLUMNS
        .iter()
        .zip(row)
        .map(|(c, v)| vec![c.to_string(), v.clone()])
        .collect();
    table("Row appended to the grid", &["column", "value"], &rows)
}

/// A measurement's table, or the clear reason why nothing was measured (never a fake figure).
pub fn outcome(result: &Result<Measurement, MeasureError>) -> Html {
    match result {
        Ok(m) => m.html(),
        Err(e) => Html(format!(
            "<p><b>No measurement.</b> {}</p>",
            esc(&e.to_string())
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_escaped() {
        let h = table("a<b", &["x&y"], &[vec!["<script>".into()]]);
        assert!(
            h.0.contains("a&lt;b") && h.0.contains("x&amp;y") && h.0.contains("&lt;script&gt;")
        );
    }
}
