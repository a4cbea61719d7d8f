//! How the notebook shows the lesson: each step's figures (measured just now in a fresh GPU
//! process, or recorded on another machine and labelled so, with its environment) and the
//! allocator model's prediction of the same step in one table with their difference, the
//! allocator's map after a step, a summary like `torch.cuda.memory_summary`, the chart of all
//! steps, and the run with expandable segments beside the default one. Every method returns HTML
//! and never fails: a missing lesson says why, in the words of [`crate::markup::labels`].

use super::record::{LessonRecord, StepRecord, ALLOC_CONF};
use super::script::LessonScript;
use super::{LessonModel, PREDICTED};
use crate::allocator::{ComputeCapability, Pool, SegmentView};
use crate::markup::{labels, table, Html};
use crate::reading::{DeviceStats, StepLog, StepReading};
use crate::shown::Shown;
use crate::units::Bytes;
use std::ops::RangeInclusive;

/// The lesson with PyTorch's default settings and the one with expandable segments, each measured
/// here or recorded elsewhere.
#[derive(Debug, Clone)]
pub struct Lessons {
    pub default: Shown<LessonRecord>,
    pub expandable: Shown<LessonRecord>,
}

/// How one of the two lessons is shown: its figures, the model's beside them, its maps.
#[derive(Debug, Clone, Copy)]
pub struct LessonView<'a> {
    pub shown: &'a Shown<LessonRecord>,
    /// Whether this is the run with expandable segments.
    pub expandable: bool,
}

/// The architecture the notebook's prediction assumes when there is no record: the H200's.
const H200: ComputeCapability = ComputeCapability::new(9, 0);

fn note(text: &str) -> Html {
    Html::note(text)
}

fn bold_note(head: &str, text: &str) -> Html {
    Html(format!(
        "<p><b>{}</b> {}</p>",
        html_escape::encode_text(head),
        html_escape::encode_text(text)
    ))
}

/// 1-based step numbers as a 0-based index range, clamped to `len` entries (`None`: empty).
fn indices(range: &RangeInclusive<usize>, len: usize) -> Option<(usize, usize)> {
    let first = range.start().max(&1) - 1;
    let end = (*range.end()).min(len);
    (first < end).then_some((first, end))
}

/// A byte count with its digits grouped and MiB beside it.
fn bytes(v: u64) -> String {
    format!("{} ({})", crate::units::grouped(v), Bytes(v).mib_text())
}

impl LessonView<'_> {
    fn record(&self) -> Option<&LessonRecord> {
        self.shown.value.as_ref()
    }

    /// The line that says where the figures come from (it heads every table).
    pub fn source(&self) -> String {
        let settings = if self.expandable {
            format!("{ALLOC_CONF}=expandable_segments:True")
        } else {
            "default allocator settings".into()
        };
        match (self.record(), self.shown.recorded_file()) {
            (Some(r), None) => format!(
                "MEASURED just now on this machine ({}, {settings}), in a fresh GPU process",
                r.gpu_name()
            ),
            (Some(r), Some(file)) => format!(
                "{} on {} ({settings}) at {}, not measured on this machine ({})",
                labels::RECORDED_ELSEWHERE,
                r.gpu_name(),
                r.recorded_at,
                file.file_name()
                    .map_or(file.display().to_string(), |n| n.to_string_lossy().into()),
            ),
            (None, _) => format!("no lesson ({settings})"),
        }
    }

    /// Why nothing is shown (no GPU here and no readable recording), as the notes every cell
    /// repeats; `None` when there is a lesson.
    fn absent(&self) -> Option<Html> {
        if self.record().is_some() {
            return None;
        }
        let mut h = Html(String::new());
        if let Some(why) = self.shown.not_measured() {
            h = h.then(bold_note(labels::NO_GPU, why));
        }
        Some(h.then(note(self.shown.missing.as_deref().unwrap_or("No lesson."))))
    }

    /// Where the figures come from, why nothing was measured here (when nothing was), the
    /// recorded environment and the allocator's settings.
    pub fn header(&self) -> Html {
        if let Some(h) = self.absent() {
            return h;
        }
        let r = self.record().expect("a record");
        let mut h = bold_note(&self.source(), "");
        if let Some(why) = self.shown.not_measured() {
            h = h.then(bold_note(labels::NO_GPU, why));
        }
        let s = &r.allocator_settings;
        h = h.then(note(&format!(
            "{ALLOC_CONF}: {}. The allocator reported: expandable segments {}, large segment \
             {} bytes, max_split_size {}, settings parsed: {}.",
            r.configuration_shown(),
            if s.expandable_segments { "on" } else { "off" },
            s.large_segment_size,
            s.max_split_size
                .map_or("unlimited".to_string(), |b| format!("{b} bytes")),
            if s.parsed.is_empty() {
                "none".to_string()
            } else {
                format!("`{}`", s.parsed)
            }
        )));
        h.then(r.environment.html())
    }

    /// The figures of steps `range` (numbered as in the tables, 1 = the start), each with the
    /// change from the step before, and the model's prediction of the same steps under them (or
    /// why there is none).
    pub fn steps(&self, range: RangeInclusive<usize>) -> Html {
        let Some(r) = self.record() else {
            let h = self.absent().unwrap_or(Html(String::new()));
            return h.then(self.prediction_without_record(|m| {
                match indices(&range, m.log.steps.len()) {
                    Some((first, end)) => m.log.rows(first, end),
                    None => note("(no predicted step in this range)"),
                }
            }));
        };
        let log = r.log(&self.source());
        let Some((first, end)) = indices(&range, log.steps.len()) else {
            return note(&format!(
                "This lesson has {} steps: none in {}..={}.",
                log.steps.len(),
                range.start(),
                range.end()
            ));
        };
        match r.model() {
            Ok(m) => beside_prediction(&log, &m.log, first, end),
            Err(why) => log.rows(first, end).then(note(&why)),
        }
    }

    /// Without a record: the model's prediction of the standard lesson's steps of fixed size on
    /// an H200, labelled as such.
    fn prediction_without_record(&self, show: impl FnOnce(&LessonModel) -> Html) -> Html {
        let Ok(mut m) = LessonModel::with_expandable_segments(H200, self.expandable) else {
            return Html(String::new());
        };
        for step in LessonScript::standard().steps {
            if step.is_relative() {
                break;
            }
            let label = step.label(None);
            if m.run(&step, None, &label).is_err() {
                break;
            }
        }
        note(
            "Nothing measured or recorded to show: below, the allocator model's prediction alone \
             for an H200, labelled as such (the last steps are sized from the free memory of the \
             GPU they run on, so the model cannot size them without a run).",
        )
        .then(show(&m))
    }

    /// The record of step `n` (numbered as in the tables), or why there is none.
    fn step(&self, n: usize) -> Result<(&LessonRecord, usize, &StepRecord), Html> {
        let r = self.record().ok_or_else(|| note("No lesson."))?;
        match n
            .checked_sub(1)
            .and_then(|i| r.steps.get(i).map(|s| (i, s)))
        {
            Some((i, s)) => Ok((r, i, s)),
            None => Err(note(&format!(
                "This lesson has {} steps: there is no step {n}.",
                r.steps.len()
            ))),
        }
    }

    /// The allocator's map after step `n`: one bar per segment (for expandable segments, per
    /// contiguous mapped range), its blocks named, with the allocator's own counts; the predicted
    /// map under it.
    pub fn map(&self, n: usize) -> Html {
        if let Some(absent) = self.absent() {
            return absent.then(self.prediction_without_record(|m| {
                let i = n.wrapping_sub(1);
                match (m.maps.get(i), m.log.steps.get(i)) {
                    (Some(map), Some(reading)) => crate::plot::segment_map(
                        &format!("{PREDICTED}: the map after step {n} ({})", reading.step),
                        map,
                    )
                    .html(),
                    _ => note(&format!("(no predicted step {n})")),
                }
            }));
        }
        let (r, i, s) = match self.step(n) {
            Ok(found) => found,
            Err(h) => return h,
        };
        let mut h = map_html(
            &format!("The allocator's map after step {n}: {}", s.reading.step),
            &self.source(),
            &s.map,
            Some(&s.stats),
        );
        match r.model() {
            Ok(m) => {
                if let Some(map) = m.maps.get(i) {
                    h = h.then(
                        crate::plot::segment_map(
                            &format!("{PREDICTED}: the map after the same step"),
                            map,
                        )
                        .html(),
                    );
                }
            }
            Err(why) => h = h.then(note(&why)),
        }
        h
    }

    /// A summary of the allocator after step `n`, like `torch.cuda.memory_summary`: allocated,
    /// requested, reserved, non-releasable (inactive split) bytes and blocks, live blocks,
    /// segments, per pool from the map, with the retries and out-of-memory counters; the
    /// predicted summary under it.
    pub fn summary(&self, n: usize) -> Html {
        if let Some(absent) = self.absent() {
            return absent.then(self.prediction_without_record(|m| {
                let i = n.wrapping_sub(1);
                match (m.log.steps.get(i), m.stats.get(i), m.maps.get(i)) {
                    (Some(reading), Some(stats), Some(map)) => summary_table(
                        &format!(
                            "{} — allocator summary after step {n}",
                            m.log.source.clone().unwrap_or_default()
                        ),
                        reading,
                        stats,
                        map,
                    ),
                    _ => note(&format!("(no predicted step {n})")),
                }
            }));
        }
        let (r, i, s) = match self.step(n) {
            Ok(found) => found,
            Err(h) => return h,
        };
        let mut h = summary_table(
            &format!(
                "{} — allocator summary after step {n}: {}",
                self.source(),
                s.reading.step
            ),
            &s.reading,
            &s.stats,
            &s.map,
        );
        if r.allocator_settings.expandable_segments {
            h = h.then(note(EXPANDABLE_COUNTS));
        }
        match r.model() {
            Ok(m) => {
                if let (Some(reading), Some(stats), Some(map)) =
                    (m.log.steps.get(i), m.stats.get(i), m.maps.get(i))
                {
                    h = h.then(summary_table(
                        &format!(
                            "{} — allocator summary after the same step",
                            m.log.source.clone().unwrap_or_default()
                        ),
                        reading,
                        stats,
                        map,
                    ));
                }
            }
            Err(why) => h = h.then(note(&why)),
        }
        h
    }

    /// `allocated`, `reserved` and the GPU memory in use over every step, with how many steps the
    /// model predicted exactly.
    pub fn chart(&self) -> Html {
        let Some(r) = self.record() else {
            let h = self.absent().unwrap_or(Html(String::new()));
            return h.then(self.prediction_without_record(|m| m.log.chart()));
        };
        let verdict = match r.exact_steps() {
            Some((equal, of)) => format!(
                "The allocator model's prediction equals the measurement (allocated, reserved, \
                 both peaks, requested, segments and the statistics) at {equal} of {of} steps."
            ),
            None => r
                .why_not_predicted()
                .unwrap_or_else(|| r.model().err().unwrap_or_default()),
        };
        crate::plot::step_chart(&r.log(&self.source())).with_caption(&verdict)
    }
}

/// What the allocator does not count with expandable segments, and where PyTorch's source says so.
const EXPANDABLE_COUNTS: &str = "With expandable segments the allocator counts no segment \
    (map_block adds the pages it maps to reserved_bytes only) and no inactive split block \
    (free_block and alloc_found_block leave expandable segments out of inactive_split), in \
    c10/cuda/CUDACachingAllocator.cpp; the map's segments are its contiguous mapped ranges, as \
    snapshot() lists them.";

/// The map under `title`, with the allocator's own counts (when known) as its caption.
fn map_html(title: &str, source: &str, map: &[SegmentView], stats: Option<&DeviceStats>) -> Html {
    let counted = match stats {
        Some(s) => format!(
            "; the allocator counts {} segment(s), and {} bytes in {} free block(s) inside \
             segments that also hold live blocks (inactive split: empty_cache cannot return them)",
            s.segments, s.inactive_split_bytes, s.inactive_split_blocks
        ),
        None => String::new(),
    };
    crate::plot::segment_map(title, map).with_caption(&format!(
        "{source}: {} segment(s) in the map{counted}.",
        map.len()
    ))
}

/// Figures of one pool (or all) from the allocator's map.
#[derive(Default)]
struct PoolFigures {
    allocated: u64,
    requested: u64,
    reserved: u64,
    inactive_split: u64,
    live_blocks: u64,
    inactive_split_blocks: u64,
    segments: u64,
}

fn pool_figures(map: &[SegmentView], pool: Pool) -> PoolFigures {
    let mut f = PoolFigures::default();
    for s in map.iter().filter(|s| s.pool == pool) {
        f.segments += 1;
        f.reserved = f.reserved.saturating_add(s.size);
        for b in &s.blocks {
            if b.allocated {
                f.live_blocks += 1;
                f.allocated = f.allocated.saturating_add(b.size);
                f.requested = f.requested.saturating_add(b.requested_size);
            } else if b.inactive_split {
                f.inactive_split_blocks += 1;
                f.inactive_split = f.inactive_split.saturating_add(b.size);
            }
        }
    }
    f
}

/// The summary table of one step.
fn summary_table(caption: &str, r: &StepReading, s: &DeviceStats, map: &[SegmentView]) -> Html {
    let (large, small) = (
        pool_figures(map, Pool::Large),
        pool_figures(map, Pool::Small),
    );
    let n = |v: u64| v.to_string();
    let none = String::new;
    let row = |metric: &str, current: String, peak: String, l: String, sm: String| {
        vec![metric.to_string(), current, peak, l, sm]
    };
    let rows = vec![
        row(
            "allocated memory",
            n(r.allocated),
            n(r.peak_allocated),
            n(large.allocated),
            n(small.allocated),
        ),
        row(
            "requested memory",
            n(s.requested_bytes),
            none(),
            n(large.requested),
            n(small.requested),
        ),
        row(
            "GPU reserved memory",
            n(r.reserved),
            n(r.peak_reserved),
            n(large.reserved),
            n(small.reserved),
        ),
        row(
            "non-releasable memory (inactive split bytes)",
            n(s.inactive_split_bytes),
            none(),
            n(large.inactive_split),
            n(small.inactive_split),
        ),
        row(
            "non-releasable blocks (inactive split)",
            n(s.inactive_split_blocks),
            none(),
            n(large.inactive_split_blocks),
            n(small.inactive_split_blocks),
        ),
        row(
            "live blocks (allocations)",
            n(large.live_blocks + small.live_blocks),
            none(),
            n(large.live_blocks),
            n(small.live_blocks),
        ),
        row(
            "GPU reserved segments",
            n(s.segments),
            none(),
            n(large.segments),
            n(small.segments),
        ),
        row(
            "cudaMalloc retries (num_alloc_retries)",
            n(s.alloc_retries),
            none(),
            none(),
            none(),
        ),
        row(
            "out-of-memory errors (num_ooms)",
            n(s.ooms),
            none(),
            none(),
            none(),
        ),
    ];
    table(
        caption,
        &[
            "",
            "all pools, now (the allocator's counters)",
            "peak",
            "large pool (from the map)",
            "small pool (from the map)",
        ],
        &rows,
    )
}

impl Lessons {
    /// The lesson with PyTorch's default settings.
    pub fn default_view(&self) -> LessonView<'_> {
        LessonView {
            shown: &self.default,
            expandable: false,
        }
    }

    /// The lesson with expandable segments.
    pub fn expandable_view(&self) -> LessonView<'_> {
        LessonView {
            shown: &self.expandable,
            expandable: true,
        }
    }

    /// Where both lessons come from; the default one's environment.
    pub fn header(&self) -> Html {
        let e = self.expandable_view();
        let expandable = match e.record() {
            Some(_) => bold_note(&e.source(), ""),
            None => e.absent().unwrap_or(Html(String::new())),
        };
        self.default_view()
            .header()
            .then(note("And the same lesson with expandable segments:"))
            .then(expandable)
    }

    /// Steps `range` of the default lesson (see [`LessonView::steps`]).
    pub fn steps(&self, range: RangeInclusive<usize>) -> Html {
        self.default_view().steps(range)
    }

    /// The default lesson's map after step `n` (see [`LessonView::map`]).
    pub fn map(&self, n: usize) -> Html {
        self.default_view().map(n)
    }

    /// The default lesson's summary after step `n` (see [`LessonView::summary`]).
    pub fn summary(&self, n: usize) -> Html {
        self.default_view().summary(n)
    }

    /// The default lesson's chart (see [`LessonView::chart`]).
    pub fn chart(&self) -> Html {
        self.default_view().chart()
    }

    /// The two runs side by side: after every step, the counters of each (allocated, reserved,
    /// segments counted and in the map, inactive split bytes, retries), then both maps after step
    /// `n`, and how far the model's prediction of each run is from it.
    pub fn compare(&self, n: usize) -> Html {
        let (dv, ev) = (self.default_view(), self.expandable_view());
        let (Some(d), Some(e)) = (dv.record(), ev.record()) else {
            let mut h = Html(String::new());
            for view in [dv, ev] {
                if let Some(absent) = view.absent() {
                    h = h.then(note(&view.source())).then(absent);
                }
            }
            return h;
        };
        let cell = |s: Option<&StepRecord>, f: fn(&StepRecord) -> u64| {
            s.map_or("—".to_string(), |s| f(s).to_string())
        };
        let fields: [fn(&StepRecord) -> u64; 6] = [
            |s| s.reading.allocated,
            |s| s.reading.reserved,
            |s| s.stats.segments,
            |s| s.map.len() as u64,
            |s| s.stats.inactive_split_bytes,
            |s| s.stats.alloc_retries,
        ];
        let rows: Vec<Vec<String>> = (0..d.steps.len().max(e.steps.len()))
            .map(|i| {
                let (a, b) = (d.steps.get(i), e.steps.get(i));
                let title = a
                    .or(b)
                    .map(|s| s.step.as_ref().map_or("start".into(), |st| st.title()))
                    .unwrap_or_default();
                let mut row = vec![format!("{}. {title}", i + 1)];
                for f in fields {
                    row.push(cell(a, f));
                    row.push(cell(b, f));
                }
                row
            })
            .collect();
        let h = table(
            &format!(
                "After each step — default: {} | expandable: {}",
                dv.source(),
                ev.source()
            ),
            &[
                "step",
                "allocated (default)",
                "allocated (expandable)",
                "reserved (default)",
                "reserved (expandable)",
                "segments counted (default)",
                "segments counted (expandable)",
                "segments in the map (default)",
                "segments in the map (expandable)",
                "inactive split bytes (default)",
                "inactive split bytes (expandable)",
                "alloc retries (default)",
                "alloc retries (expandable)",
            ],
            &rows,
        );
        let maps = [(d, dv), (e, ev)].map(|(r, view)| {
            match n.checked_sub(1).and_then(|i| r.steps.get(i)) {
                Some(s) => map_html(
                    &format!("After step {n}: {}", s.reading.step),
                    &view.source(),
                    &s.map,
                    Some(&s.stats),
                ),
                None => note(&format!("{}: there is no step {n}.", view.source())),
            }
        });
        let [dm, em] = maps;
        let verdicts =
            [(d, "default settings"), (e, "expandable segments")].map(|(r, what)| {
                match r.exact_steps() {
                    Some((equal, of)) => format!(
                    "The allocator model's prediction with {what} equals {equal} of {of} steps."
                ),
                    None => r.why_not_predicted().unwrap_or_default(),
                }
            });
        h.then(note(EXPANDABLE_COUNTS))
            .then(dm)
            .then(em)
            .then(note(&verdicts.join(" ")))
    }

    pub fn evcxr_display(&self) {
        self.header().evcxr_display()
    }
}

impl LessonView<'_> {
    pub fn evcxr_display(&self) {
        self.header().evcxr_display()
    }
}

/// Steps `first..end` measured (or recorded) and predicted in one table: for each step the
/// measured figures, the predicted ones under them, and measured − predicted (0 where the model
/// is exact); bytes with digits grouped and MiB beside them.
fn beside_prediction(measured: &StepLog, predicted: &StepLog, first: usize, end: usize) -> Html {
    let figures = |s: &StepReading| {
        [
            s.requested,
            s.allocated,
            s.reserved,
            s.peak_allocated,
            s.peak_reserved,
        ]
    };
    let mut rows = Vec::new();
    for i in first..end.min(measured.steps.len()) {
        let m = &measured.steps[i];
        let prev = i.checked_sub(1).map(|j| &measured.steps[j]);
        let delta = |now: u64, before: Option<u64>| {
            before.map_or(String::new(), |b| {
                format!("{:+}", i128::from(now) - i128::from(b))
            })
        };
        let mut row = vec![format!("{}. {}", i + 1, m.step), "measured".into()];
        row.extend(figures(m).map(bytes));
        row.push(m.segments.to_string());
        row.push(delta(m.allocated, prev.map(|p| p.allocated)));
        row.push(delta(m.reserved, prev.map(|p| p.reserved)));
        row.push(m.runtime_used.map_or("—".into(), bytes));
        rows.push(row);
        if let Some(p) = predicted.steps.get(i) {
            let mut row = vec![String::new(), "predicted".into()];
            row.extend(figures(p).map(bytes));
            row.push(p.segments.to_string());
            row.extend([String::new(), String::new(), "—".into()]);
            rows.push(row);
            let mut row = vec![String::new(), "measured − predicted".into()];
            let (fm, fp) = (figures(m), figures(p));
            row.extend((0..5).map(|k| format!("{:+}", i128::from(fm[k]) - i128::from(fp[k]))));
            row.push(format!(
                "{:+}",
                i128::from(m.segments) - i128::from(p.segments)
            ));
            row.extend([String::new(), String::new(), String::new()]);
            rows.push(row);
        }
    }
    table(
        &format!(
            "{} | {}",
            measured.source.as_deref().unwrap_or("measured"),
            predicted.source.as_deref().unwrap_or("predicted")
        ),
        &[
            "step",
            "",
            "requested",
            "allocated",
            "reserved",
            "peak allocated",
            "peak reserved",
            "segments",
            "Δ allocated",
            "Δ reserved",
            "GPU used (runtime)",
        ],
        &rows,
    )
}
