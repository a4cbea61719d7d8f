//! Rich display of the reports for notebooks: each report's HTML form, drawn from the same rows or
//! columns as its text form, and shown inline by the evcxr kernel (inherent `evcxr_display`
//! methods). A missing figure is always said in the words of [`crate::markup::labels`].

use crate::catalog::{Catalog, CATALOG_COLUMNS};
use crate::environment::EnvironmentReport;
use crate::estimate::WeightEstimate;
use crate::grid::{GridReport, GridRow};
use crate::markup::{labels, rows_html, table, Html};
use crate::measure::{phase_cells, MeasureError, Measurement, PHASE_COLUMNS};
use crate::quote::Quote;
use crate::reading::StepLog;

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
    crate::budget::Budget,
    crate::budget::FitPlan,
    crate::budget::Presets,
    WeightEstimate,
    EnvironmentReport,
    Measurement,
    Quote,
    Catalog,
    GridReport,
    GridRow,
    StepLog
);

impl WeightEstimate {
    pub fn html(&self) -> Html {
        rows_html(
            "Weight-memory estimate",
            &self.rows(),
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
        rows_html("Environment", &self.rows(), &self.notes.join(" "))
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
            c.hidden(),
            c.dtype.name(),
            self.measured_at
        );
        let rows: Vec<Vec<String>> = self
            .phases
            .iter()
            .map(|p| phase_cells(p).to_vec())
            .collect();
        table(&caption, &PHASE_COLUMNS, &rows).then(Html::note(&self.notes.join(" ")))
    }
}

impl Quote {
    pub fn html(&self) -> Html {
        rows_html("Package quote", &self.rows(), self.catalog.banner())
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

impl GridRow {
    /// The row as a two-column table (column, value).
    pub fn html(&self) -> Html {
        let rows: Vec<Vec<String>> = self
            .named_cells()
            .into_iter()
            .map(|(c, v)| vec![c.to_string(), v])
            .collect();
        table("Row of the results grid", &["column", "value"], &rows)
    }
}

impl StepLog {
    /// Steps `first..end` (0-based, clamped to the log), numbered from 1, with the change from
    /// the step before each.
    pub fn rows(&self, first: usize, end: usize) -> Html {
        let end = end.min(self.steps.len());
        let start = first.min(end);
        let delta = |now: u64, before: Option<u64>| match before {
            Some(b) => format!("{:+}", now as i128 - b as i128),
            None => String::new(),
        };
        let runtime = |v: Option<u64>| v.map_or("—".to_string(), |b| b.to_string());
        let rows: Vec<Vec<String>> = (start..end)
            .map(|i| {
                let s = &self.steps[i];
                let prev = i.checked_sub(1).map(|j| &self.steps[j]);
                vec![
                    format!("{}. {}", i + 1, s.step),
                    s.requested.to_string(),
                    s.allocated.to_string(),
                    delta(s.allocated, prev.map(|p| p.allocated)),
                    s.reserved.to_string(),
                    delta(s.reserved, prev.map(|p| p.reserved)),
                    s.peak_allocated.to_string(),
                    s.peak_reserved.to_string(),
                    s.segments.to_string(),
                    runtime(s.runtime_used),
                    runtime(s.runtime_used.map(|u| u.saturating_sub(s.reserved))),
                ]
            })
            .collect();
        let caption = match &self.source {
            Some(source) => format!("{source}: caching allocator, bytes"),
            None => "Caching allocator, bytes".to_string(),
        };
        table(
            &caption,
            &[
                "step",
                "requested",
                "allocated",
                "Δ allocated",
                "reserved",
                "Δ reserved",
                "peak allocated",
                "peak reserved",
                "segments",
                "GPU used (runtime)",
                "GPU used − reserved",
            ],
            &rows,
        )
    }

    pub fn html(&self) -> Html {
        self.rows(0, self.steps.len())
    }

    /// Allocated, reserved and GPU-used over the steps, as inline SVG.
    pub fn chart(&self) -> Html {
        crate::plot::step_chart(self).html()
    }
}

/// A measurement's table, or the clear reason why nothing was measured (never a fake figure).
pub fn outcome(result: &Result<Measurement, MeasureError>) -> Html {
    match result {
        Ok(m) => m.html(),
        Err(e) => Html(format!(
            "<p><b>{}</b> {}</p>",
            labels::NO_MEASUREMENT,
            html_escape::encode_text(&e.to_string())
        )),
    }
}
