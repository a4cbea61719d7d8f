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
use crate::shown::Shown;

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
    crate::budget::fit::Spread,
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

impl Shown<Measurement> {
    /// One line saying what is shown and where it was measured.
    pub fn origin(&self) -> String {
        match &self.value {
            Some(m) => format!(
                "{} on {}, {}: {}",
                m.configuration.device,
                m.gpu_name(),
                m.measured_at,
                self.whence()
            ),
            None => self.value_or_why().err().unwrap_or_default(),
        }
    }

    /// The per-phase chart under its origin line.
    pub fn chart(&self) -> Html {
        match self.value_or_why() {
            Ok(m) => m.chart().with_caption(&self.origin()),
            Err(why) => Html::note(&why),
        }
    }

    /// The allocator's map when `allocated` peaked during the cold pass, every block named: the
    /// measured map when the measurement recorded one (`--blocks`), else the model's, said so.
    pub fn cold_pass_map(&self) -> Html {
        use crate::reading::Phase;
        let m = match self.value_or_why() {
            Ok(m) => m,
            Err(why) => return Html::note(&why),
        };
        let cold = m.phases.iter().find(|p| p.phase == Phase::ColdForward);
        let (segments, whence) = match cold.and_then(|p| p.blocks.as_ref()) {
            Some(b) => (b.at_peak.clone(), "the allocator's own map, measured".to_string()),
            None => match m.model_prediction(&Default::default()) {
                Ok(p) => (
                    p.phases
                        .iter()
                        .find(|r| r.phase == Phase::ColdForward)
                        .map(|r| r.segments_at_end.clone())
                        .unwrap_or_default(),
                    "PREDICTED by the allocator model (this file holds no map): the end of the pass"
                        .to_string(),
                ),
                Err(_) => (Vec::new(), "no map recorded and no prediction possible".to_string()),
            },
        };
        crate::plot::segment_map(&format!("cold_forward: {whence}"), &segments)
            .with_caption(&self.origin())
    }

    /// Each phase row measured, predicted and their difference, as a table.
    pub fn prediction_table(&self) -> Html {
        let shown = match self.value_or_why() {
            Ok(m) => m,
            Err(why) => return Html::note(&why),
        };
        let (m, note) = if shown.phases.iter().all(|p| p.prediction.is_some()) {
            (
                std::borrow::Cow::Borrowed(shown),
                "Predictions as recorded with the measurement.",
            )
        } else {
            let mut m = shown.clone();
            m.attach_prediction(Ok(Default::default()));
            (
                std::borrow::Cow::Owned(m),
                "Predicted now, with PyTorch's default workspace settings.",
            )
        };
        let mut rows = Vec::new();
        for p in &m.phases {
            let Some(pred) = &p.prediction else { continue };
            let label = match p.repetition {
                Some(r) => format!("{} {r}", p.phase.name()),
                None => p.phase.name().to_string(),
            };
            let measured = ("measured", p.figures.named().map(|(_, v)| v.to_string()));
            for (what, values) in std::iter::once(measured).chain(pred.cells()) {
                let mut row = vec![label.clone(), what.to_string()];
                row.extend(values);
                rows.push(row);
            }
        }
        let verdict = match &m.model {
            Some(c) if c.not_predicted.is_none() => format!(
                "{} of {} rows exact to the byte ({}). {note}",
                c.exact_rows, c.rows, c.model
            ),
            Some(c) => format!(
                "No prediction: {}",
                c.not_predicted.as_deref().unwrap_or("")
            ),
            None => "No prediction.".into(),
        };
        table(
            &format!("Measured and predicted, bytes ({})", self.origin()),
            &[&["phase", ""], &PHASE_COLUMNS[2..8]].concat(),
            &rows,
        )
        .then(Html::note(&verdict))
    }
}

impl Shown<crate::sweep::Sweep> {
    /// The sweep's chart under a line saying where it was measured.
    pub fn chart(&self) -> Html {
        match self.value_or_why() {
            Ok(sweep) => {
                let whence = match self.recorded_file() {
                    None => {
                        "measured just now on this machine, one fresh process per point".to_string()
                    }
                    Some(_) => self.whence(),
                };
                sweep
                    .chart()
                    .with_caption(&format!("{}: {whence}", sweep.gpu_name()))
            }
            Err(why) => Html::note(&why),
        }
    }
}
