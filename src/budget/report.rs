//! The budget and the fit plan as a person reads them: text tables with exact bytes beside GiB
//! and GB, and the same tables in HTML for notebooks.

use super::fit::{FitPlan, FitRow};
use super::terms::{Budget, Split, Term};
use super::workload::{Mode, WeightFormat};
use crate::markup::{table, Html, Table};
use crate::units::{grouped, Bytes, ROUNDING_RULE};
use std::fmt;

/// Column titles of the budget table.
pub const TERM_COLUMNS: [&str; 7] = ["term", "bytes", "GiB", "GB", "at peak", "status", "split"];
/// Column titles of the fit table.
pub const FIT_COLUMNS: [&str; 8] = [
    "GPU",
    "days",
    "lots",
    "GPUs",
    "usable / GPU",
    "need / GPU",
    "headroom / GPU",
    "total price",
];

impl Budget {
    /// One line naming the workload.
    pub fn title(&self) -> String {
        let w = &self.workload;
        let model = w.preset.clone().unwrap_or_else(|| "custom shape".into());
        let weights = match w.weights {
            WeightFormat::Dense => w.dtype.to_string(),
            f => format!("{} weights, {} compute", f.name(), w.dtype),
        };
        let mode = match &w.mode {
            Mode::Inference {
                generated,
                kv_cache,
            } => format!(
                "inference, batch {}, {} prompt + {generated} generated tokens, KV cache {}",
                w.batch,
                w.context,
                kv_cache.name()
            ),
            Mode::Lora { rank, .. } => format!(
                "{} rank {rank}, batch {}, sequence {}",
                if w.weights == WeightFormat::Nf4 {
                    "QLoRA"
                } else {
                    "LoRA"
                },
                w.batch,
                w.context
            ),
            Mode::Full { optimizer } => format!(
                "full training ({}), batch {}, sequence {}",
                optimizer.name(),
                w.batch,
                w.context
            ),
        };
        let extras = [
            (w.checkpointing, "gradient checkpointing"),
            (w.flash_attention, "flash attention"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect::<Vec<_>>();
        let extras = if extras.is_empty() {
            String::new()
        } else {
            format!(", {}", extras.join(", "))
        };
        format!("{model}, {weights}, {mode}{extras}")
    }

    fn cells(t: &Term) -> Vec<String> {
        vec![
            t.name.clone(),
            t.bytes.grouped(),
            t.bytes.gib(2).to_string(),
            t.bytes.gb(2).to_string(),
            if t.at_peak == t.bytes {
                "all".into()
            } else {
                t.at_peak.gib_text()
            },
            t.status.name().into(),
            split_name(t.split).into(),
        ]
    }

    fn summary(&self) -> Vec<(String, Bytes)> {
        vec![
            ("predicted peak of allocated".into(), self.peak_allocated),
            ("total on one GPU".into(), self.total),
        ]
    }

    fn notes(&self) -> Vec<String> {
        let mut notes = vec![format!(
            "Peak on one GPU: the {} ({}).",
            self.peak_moment, self.peak_rule
        )];
        for t in &self.terms {
            let status = match &t.status {
                super::TermStatus::Estimated { source, bound } => {
                    format!(" [estimated: {source}; {bound}]")
                }
                super::TermStatus::Measured { on, source } => {
                    format!(" [measured on {on}: {source}]")
                }
                _ => String::new(),
            };
            notes.push(format!("{}: {}{status}", t.name, t.formula));
        }
        notes.push(format!(
            "1 GiB = 2^30 bytes, 1 GB = 10^9 bytes; {ROUNDING_RULE}."
        ));
        notes
    }

    /// The terms, then the predicted peak and the total, as table rows.
    fn rows(&self) -> Vec<Vec<String>> {
        let mut rows: Vec<Vec<String>> = self.terms.iter().map(Self::cells).collect();
        for (label, b) in self.summary() {
            let mut row = vec![
                label,
                b.grouped(),
                b.gib(2).to_string(),
                b.gb(2).to_string(),
            ];
            row.resize(TERM_COLUMNS.len(), String::new());
            rows.push(row);
        }
        rows
    }

    pub fn html(&self) -> Html {
        let rows = self.rows();
        let mut h = table(&format!("Budget — {}", self.title()), &TERM_COLUMNS, &rows);
        for n in self.notes() {
            h = h.then(Html::note(&n));
        }
        h
    }
}

fn split_name(s: Split) -> &'static str {
    match s {
        Split::Sharded => "sharded",
        Split::KvHeads => "by KV heads",
        Split::PerGpu => "per GPU",
    }
}

/// `rows` under `header` as aligned text columns (first column left, others right).
fn text_table(f: &mut fmt::Formatter<'_>, header: &[&str], rows: &[Vec<String>]) -> fmt::Result {
    write!(f, "{}", Table::new(header, rows.to_vec()).with_gap(2))
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Budget — {}", self.title())?;
        writeln!(
            f,
            "{} parameters, {} trained",
            grouped(self.parameters),
            grouped(self.trainable_parameters)
        )?;
        let rows = self.rows();
        text_table(f, &TERM_COLUMNS, &rows)?;
        for n in self.notes() {
            writeln!(f, "- {n}")?;
        }
        Ok(())
    }
}

impl FitRow {
    fn cells(&self) -> Vec<String> {
        let (lots, gpus, need, headroom, price) = match &self.fit {
            Some(fit) => (
                fit.lots.to_string(),
                fit.gpus.to_string(),
                fit.need_per_gpu.gib_text(),
                fit.headroom_per_gpu.gib_text(),
                fit.total_usd_cents.to_string(),
            ),
            None => (
                "—".into(),
                "—".into(),
                "does not fit".into(),
                self.shortfall
                    .map_or("—".into(), |s| format!("short by {}", s.gib_text())),
                "—".into(),
            ),
        };
        vec![
            format!("{} ({})", self.model, self.display_name),
            self.duration_days.to_string(),
            lots,
            gpus,
            self.usable_per_gpu.gib_text(),
            need,
            headroom,
            price,
        ]
    }
}

impl FitPlan {
    fn verdict(&self) -> String {
        match (self.cheapest(), self.smallest_shortfall()) {
            (Some(r), _) => {
                let fit = r.fit.as_ref().expect("a fitting row");
                format!(
                    "Cheapest: {} lot(s) of {} ({} GPU(s)) for {} days, {}.",
                    fit.lots, r.model, fit.gpus, r.duration_days, fit.total_usd_cents
                )
            }
            (None, Some(r)) => format!(
                "Nothing in the catalog fits on up to {} GPUs; the smallest shortfall is {} per GPU, on {}.",
                self.max_gpus,
                r.shortfall.expect("a short row").gib_text(),
                r.model
            ),
            (None, None) => "Nothing in the catalog fits.".into(),
        }
    }

    pub fn html(&self) -> Html {
        let rows: Vec<Vec<String>> = self.rows.iter().map(FitRow::cells).collect();
        table(
            &format!(
                "Fit — {} (budget {} on one GPU)",
                self.workload,
                self.budget_total.gib_text()
            ),
            &FIT_COLUMNS,
            &rows,
        )
        .then(Html::note(&self.verdict()))
        .then(Html::note(&format!("Split rule: {}", self.split_rule)))
        .then(Html::note(&format!("Catalog: {}", self.catalog)))
        .then(Html::note(self.catalog.banner()))
    }
}

impl fmt::Display for FitPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "Fit — {} (budget {} on one GPU)",
            self.workload,
            self.budget_total.gib_text()
        )?;
        let rows: Vec<Vec<String>> = self.rows.iter().map(FitRow::cells).collect();
        text_table(f, &FIT_COLUMNS, &rows)?;
        writeln!(f, "{}", self.verdict())?;
        writeln!(f, "Split rule: {}", self.split_rule)?;
        writeln!(f, "Catalog: {}", self.catalog)?;
        write!(f, "{}", self.catalog.banner())
    }
}

const PRESET_COLUMNS: [&str; 8] = [
    "preset",
    "name",
    "parameters",
    "layers",
    "hidden",
    "heads/KV",
    "vocab",
    "attention",
];

impl super::Presets {
    fn cells(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|p| {
                vec![
                    p.preset.clone(),
                    p.name.clone(),
                    grouped(p.shape().parameters()),
                    p.layers.to_string(),
                    p.hidden.to_string(),
                    format!("{}/{}", p.heads, p.kv_heads),
                    p.vocab.to_string(),
                    p.attention.name().into(),
                ]
            })
            .collect()
    }

    pub fn html(&self) -> Html {
        table(
            &format!("Model presets ({})", self.file),
            &PRESET_COLUMNS,
            &self.cells(),
        )
        .then(Html::note(SOURCES_NOTE))
    }
}

const SOURCES_NOTE: &str =
    "Sources: the config.json named in each row of the file. Sliding-window \
and latent attention are listed but refused by budgets.";

impl fmt::Display for super::Presets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Model presets ({})", self.file)?;
        text_table(f, &PRESET_COLUMNS, &self.cells())?;
        write!(f, "{SOURCES_NOTE}")
    }
}

impl super::verify::Verification {
    fn cells(&self) -> Vec<Vec<String>> {
        let mut rows: Vec<Vec<String>> = self
            .checks
            .iter()
            .map(|c| {
                vec![
                    c.term.clone(),
                    c.stage.clone(),
                    c.formula.grouped(),
                    c.allocator_model.map_or("—".into(), |b| b.grouped()),
                    c.measured.grouped(),
                    format!("{} B", c.residual),
                ]
            })
            .collect();
        rows.push(vec![
            "peak of allocated".into(),
            "whole run".into(),
            self.predicted_peak.grouped(),
            "—".into(),
            self.measured_peak.grouped(),
            format!("{:+.3} %", self.peak_error_percent),
        ]);
        rows
    }

    fn caption(&self) -> String {
        format!("Budget against the {}: {}", self.gpu, self.run)
    }

    /// One line per block map compared.
    fn map_lines(&self) -> Vec<String> {
        self.maps
            .iter()
            .map(|m| {
                format!(
                    "block map at the end of {}: {} segments, {} blocks, {}",
                    m.stage,
                    m.segments,
                    m.blocks,
                    match &m.difference {
                        None => "every segment and block equal to the allocator model's, sizes and names".to_string(),
                        Some(d) => format!("DIFFERS from the allocator model's: {d}"),
                    }
                )
            })
            .collect()
    }

    pub fn html(&self) -> Html {
        let mut h = table(&self.caption(), &CHECK_COLUMNS, &self.cells());
        for line in self.map_lines() {
            h = h.then(Html::note(&line));
        }
        h.then(Html::note(CHECK_NOTE))
    }
}

const CHECK_COLUMNS: [&str; 6] = [
    "term",
    "stage",
    "budget formula",
    "allocator model",
    "measured",
    "residual",
];
const CHECK_NOTE: &str = "The allocator model replays the term's tensors in the run's order \
(512-byte rounding, segments); the residual is measured − the allocator model (else the \
formula). The predicted peak takes the exact terms as the allocator model rounds them.";

impl fmt::Display for super::verify::Verification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", self.caption())?;
        text_table(f, &CHECK_COLUMNS, &self.cells())?;
        for line in self.map_lines() {
            writeln!(f, "- {line}")?;
        }
        write!(f, "{CHECK_NOTE}")
    }
}
